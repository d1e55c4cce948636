"""The action-timeline analysis (NOTE [hand-off latency] in hetpart/runtime/handoff.py) on synthetic timelines
built here from known stage times, post delays and latencies, and sleep emulation's padding (NOTE [emulation by sleep])."""

import json

import pytest

from hetpart.runtime.emulate import SleepPadding, emulating, Emulation, RankSlot
from hetpart.runtime.handoff import analyse, match_handoffs

US = 1000  # ns


def gpipe_forward(fwd_us: list[float], m: int, latency_us: float, post_us: float, steps: int = 2,
                  tensors: int = 1, gap_us: float = 0.0) -> list[list[dict]]:
    """Events of a 2-rank GPipe forward as the recorder writes them: rank 0 computes, posts its send
    (after `post_us`), rank 1 posts its recv right before its forward and receives `latency_us` after
    both have posted; `gap_us` of the schedule's Python between rank 1's actions."""
    ranks: list[list[dict]] = [[], []]
    t = 0.0
    for step in range(steps):
        for r in ranks:
            r.append({"kind": "step", "step": step, "t_ns": int(t * US)})
        t0 = t
        free1 = t0  # rank 1 is free from here
        for i in range(m):
            start = t0 + i * fwd_us[0]
            end = start + fwd_us[0]
            ranks[0].append({"kind": "F", "step": step, "stage": 0, "mb": i, "t0_ns": int(start * US),
                             "t1_ns": int(end * US), "cpu_ns": int(fwd_us[0] * US), "proc_cpu_ns": int(fwd_us[0] * US)})
            send = end + post_us
            ops_s = [{"op": "send", "dir": "fwd", "stage": 0, "mb": i, "peer": 1, "bytes": 4096} for _ in range(tensors)]
            for op in ops_s:
                ranks[0].append({"kind": "post", "step": step, "t_ns": int(send * US), "call_ns": int(post_us * US),
                                 "ops": [op]})
            recv_post = free1 + gap_us
            arrive = max(send, recv_post) + latency_us
            ops_r = [{"op": "recv", "dir": "fwd", "stage": 1, "mb": i, "peer": 0, "bytes": 4096} for _ in range(tensors)]
            for k, op in enumerate(ops_r):
                ranks[1].append({"kind": "post", "step": step, "t_ns": int(recv_post * US), "call_ns": 0, "ops": [op]})
            for k, op in enumerate(ops_r):
                w0 = recv_post if k == 0 else arrive
                ranks[1].append({"kind": "wait", "step": step, "t0_ns": int(w0 * US), "t1_ns": int(arrive * US),
                                 "ops": [op], "post_ns": int(recv_post * US)})
            ranks[1].append({"kind": "F", "step": step, "stage": 1, "mb": i, "t0_ns": int(arrive * US),
                             "t1_ns": int((arrive + fwd_us[1]) * US), "cpu_ns": int(fwd_us[1] * US),
                             "proc_cpu_ns": int(fwd_us[1] * US)})
            ranks[1].append({"kind": "module", "step": step, "stage": 1, "t0_ns": int((arrive + 10) * US),
                             "t1_ns": int((arrive + fwd_us[1] - 10) * US)})
            free1 = arrive + fwd_us[1]
        end0, end1 = t0 + m * fwd_us[0] + post_us, free1
        ranks[0].append({"kind": "step_end", "step": step, "t_ns": int(end0 * US)})
        ranks[1].append({"kind": "step_end", "step": step, "t_ns": int(end1 * US)})
        t = max(end0, end1) + 100
    return ranks


def test_every_hand_off_is_matched_with_its_latency_and_the_receivers_lateness():
    ranks = gpipe_forward([1000, 2000], m=4, latency_us=150, post_us=50, tensors=2)
    handoffs = match_handoffs(ranks)
    assert len(handoffs) == 2 * 4 * 2  # steps x microbatches x tensors
    # the first tensor's wait takes the latency; the second is there when its wait begins
    per_mb: dict = {}
    for h in handoffs:
        per_mb.setdefault((h.step, h.mb), []).append(h.latency_us)
    assert all(sorted(v) == [pytest.approx(0), pytest.approx(150)] for v in per_mb.values())
    # rank 1 (2 ms a forward) is behind rank 0 (1 ms): microbatch i's data waits for it from the second on
    late = sorted({(h.mb, round(h.receiver_late_us)) for h in handoffs if h.step == 1})
    assert late[0] == (0, 0) and late[1][1] > 0 and [x for _, x in late] == sorted(x for _, x in late)


def test_a_slow_second_stage_waits_only_to_fill_and_its_step_is_the_critical_path():
    fwd, m, lat, post = [1000, 2000], 4, 150, 50
    report = analyse(gpipe_forward(fwd, m, lat, post))
    r0, r1 = report.ranks
    assert r1.compute_us == pytest.approx(m * fwd[1])
    assert r1.module_us == pytest.approx(m * (fwd[1] - 20)) and r1.overhead_us == pytest.approx(m * 20)
    assert r1.forward_us == r1.compute_us  # no backward in inference
    # before the first microbatch it waits for rank 0's forward and post (the sender is behind) ...
    assert r1.recv_wait_sender_behind_us == pytest.approx(fwd[0] + post)
    # ... and then one latency for every microbatch, the data being late or not
    assert r1.recv_wait_latency_us == pytest.approx(m * lat)
    assert r1.step_us == pytest.approx(fwd[0] + post + m * (lat + fwd[1]))
    assert r1.other_us == pytest.approx(0, abs=1e-6)
    assert r0.compute_us == pytest.approx(m * fwd[0]) and r0.recv_wait_sender_behind_us == 0
    cp = report.critical_path
    # independent route: the step of this schedule, in closed form, is rank 0's first forward, its post,
    # then every microbatch's latency and rank 1 forward; the path finds exactly these parts
    assert cp.step_us == pytest.approx(r1.step_us)
    assert cp.compute_us[0] == pytest.approx(fwd[0]) and cp.compute_us[1] == pytest.approx(m * fwd[1])
    assert cp.handoffs == m and cp.handoff_us == pytest.approx(m * lat)
    assert cp.gap_us == pytest.approx(post)


def test_a_slow_first_stage_puts_every_forward_of_it_on_the_critical_path():
    fwd, m, lat, post, gap = [3000, 1000], 3, 200, 0, 40
    report = analyse(gpipe_forward(fwd, m, lat, post, gap_us=gap))
    cp = report.critical_path
    # every forward of rank 0, the last hand-off, rank 1's last forward: the closed form of this schedule
    assert cp.compute_us[0] == pytest.approx(m * fwd[0]) and cp.compute_us[1] == pytest.approx(fwd[1])
    assert cp.handoffs == 1 and cp.handoff_us == pytest.approx(lat) and cp.gap_us == pytest.approx(0, abs=1e-6)
    assert cp.step_us == pytest.approx(m * fwd[0] + lat + fwd[1])
    r1 = report.ranks[1]
    # rank 1 waits for every microbatch behind its sender, then one latency each; its Python between actions
    assert r1.recv_wait_latency_us == pytest.approx(m * lat)
    assert r1.recv_wait_sender_behind_us == pytest.approx(m * fwd[0] - (m - 1) * fwd[1] - m * gap - (m - 1) * lat)
    assert r1.other_us == pytest.approx(m * gap)
    stats = report.latency_stats_us()["0->1 fwd"]
    assert stats["n"] == m and stats["latency_median_us"] == pytest.approx(lat)
    assert json.loads(json.dumps(report.to_json()))["critical_path"]["handoffs"] == 1


def test_the_first_step_is_left_out():
    ranks = gpipe_forward([1000, 1000], m=2, latency_us=100, post_us=0, steps=3)
    report = analyse(ranks)
    assert {h.step for h in report.handoffs} == {1, 2}
    assert {h.step for h in analyse(ranks, skip_first=False).handoffs} == {0, 1, 2}


def test_sleep_padding_stretches_an_action_to_its_cpu_time_over_the_share(monkeypatch):
    clock = {"wall": 10.0, "cpu": 5.0}
    slept = []
    monkeypatch.setattr("hetpart.runtime.emulate.time.perf_counter", lambda: clock["wall"])
    monkeypatch.setattr("hetpart.runtime.emulate.time.thread_time", lambda: clock["cpu"])
    monkeypatch.setattr("hetpart.runtime.emulate.time.sleep", slept.append)
    pad = SleepPadding(core=0, share=0.25)
    clock["wall"] += 0.004
    clock["cpu"] += 0.003  # 3 ms of CPU in 4 ms of wall: a device at 25% takes 12 ms, 8 more
    pad.pad(10.0, 5.0)
    assert slept == [pytest.approx(0.008)]
    clock["wall"] += 0.05  # an action that already took longer than its share: no sleep
    pad.pad(10.0, 5.0)
    assert len(slept) == 1


def test_sleep_emulation_hands_each_rank_its_slot_without_cgroups(tmp_path, monkeypatch):
    monkeypatch.setattr("hetpart.runtime.emulate.find_hierarchy", lambda: pytest.fail("sleep needs no cgroups"))
    emulation = Emulation([RankSlot(0, "m/0", "fast", 0, 1.0), RankSlot(1, "m/1", "slow", 1, 0.375)], "profile",
                          1.0, "sleep")
    lines = []
    with emulating(emulation, tmp_path, lines.append):
        padding = SleepPadding.for_rank(tmp_path, 1)
    assert (padding.core, padding.share) == (1, 0.375)
    assert "padded with a sleep" in lines[0]
    assert SleepPadding.for_rank(tmp_path / "nowhere", 1) is None


def test_the_recorder_labels_each_op_and_counts_a_posting_call_once():
    from types import SimpleNamespace

    import torch

    from hetpart.runtime.timeline import Timeline

    tl = Timeline()
    tl.step = 3
    ops = tl.label_ops([SimpleNamespace(peer=1, tensor=torch.zeros(4, 8)) for _ in range(3)], "fwd", "send", 0, 2)
    works = [object() for _ in ops]
    tl.posted(ops, works, start_ns=0)
    posts = [e for e in tl.events if e["kind"] == "post"]
    assert [e["ops"][0]["bytes"] for e in posts] == [128] * 3 and {e["ops"][0]["mb"] for e in posts} == {2}
    assert sum(e["call_ns"] > 0 for e in posts) == 1 and all(e["step"] == 3 for e in posts)
    tl.waited(works[1], 10, 20)
    wait = tl.events[-1]
    assert wait["kind"] == "wait" and wait["post_ns"] == posts[1]["t_ns"] and wait["ops"] == posts[1]["ops"]


def test_a_recv_posted_early_and_waited_on_late_costs_only_its_wait():
    # interleaved schedules post a recv ahead: posted at 0, sent at 5 ms, waited on at 75 ms for 10 us
    recv = {"op": "recv", "dir": "fwd", "stage": 1, "mb": 0, "peer": 0, "bytes": 8}
    send = dict(recv, op="send", stage=0, peer=1)
    ranks = [[{"kind": "step", "step": 0, "t_ns": 0}, {"kind": "post", "step": 0, "t_ns": 5_000_000, "ops": [send]},
              {"kind": "step_end", "step": 0, "t_ns": 6_000_000}],
             [{"kind": "step", "step": 0, "t_ns": 0}, {"kind": "post", "step": 0, "t_ns": 0, "ops": [recv]},
              {"kind": "wait", "step": 0, "t0_ns": 75_000_000, "t1_ns": 75_010_000, "ops": [recv], "post_ns": 0},
              {"kind": "step_end", "step": 0, "t_ns": 76_000_000}]]
    (h,) = match_handoffs(ranks)
    assert h.latency_us == pytest.approx(10) and h.receiver_late_us == 0
    r1 = analyse(ranks, skip_first=False).ranks[1]
    assert r1.recv_wait_latency_us == pytest.approx(10) and r1.recv_wait_sender_behind_us == 0
