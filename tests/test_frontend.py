import textwrap

import pytest
import torch

from hetpart.errors import HetpartError
from hetpart.frontend import ModelSpec, export_model, load_model


def test_zoo_models_build_deterministically():
    spec = ModelSpec("zoo:mlp", {"hidden": "16"}, batch_size=4, seq_len=1)
    (m1, x1), (m2, x2) = load_model(spec), load_model(spec)
    assert torch.equal(x1[0], x2[0])
    assert all(torch.equal(a, b) for a, b in zip(m1.state_dict().values(), m2.state_dict().values()))


def test_unknown_zoo_model_suggests_close_names():
    with pytest.raises(HetpartError, match=r"unknown model 'zoo:gpt-smal'.*did you mean zoo:gpt-small"):
        load_model(ModelSpec("zoo:gpt-smal"))


def test_unknown_set_key_lists_close_matches():
    with pytest.raises(HetpartError, match=r"--set n_layers: .*did you mean n_layer"):
        load_model(ModelSpec("zoo:gpt-small", {"n_layers": "2"}))


def test_set_value_of_wrong_type():
    with pytest.raises(HetpartError, match="expected a int"):
        load_model(ModelSpec("zoo:mlp", {"hidden": "big"}))


def test_file_model_with_kwargs(tmp_path):
    f = tmp_path / "m.py"
    f.write_text(textwrap.dedent("""
        import torch
        def make(width="8"):
            return torch.nn.Linear(4, int(width)), (torch.randn(3, 4),)
    """))
    module, inputs = load_model(ModelSpec(f"{f}:make", {"width": "5"}))
    assert module(*inputs).shape == (3, 5)
    with pytest.raises(HetpartError, match="has no parameter 'depth'"):
        load_model(ModelSpec(f"{f}:make", {"depth": "2"}))
    with pytest.raises(HetpartError, match="no function 'nope'.*make"):
        load_model(ModelSpec(f"{f}:nope"))
    with pytest.raises(HetpartError, match="not found"):
        load_model(ModelSpec(f"{tmp_path}/missing.py:make"))


def test_export_has_dynamic_batch_and_no_guard_module():
    module, inputs = load_model(ModelSpec("zoo:mlp", {"hidden": "16"}, batch_size=4))
    gm = export_model(module, inputs)
    assert not any(n.op == "call_module" for n in gm.graph.nodes)
    x = torch.randn(7, inputs[0].shape[1])
    torch.testing.assert_close(gm(x), module(x))


def test_data_dependent_control_flow_is_a_clear_error(tmp_path):
    f = tmp_path / "m.py"
    f.write_text(textwrap.dedent("""
        import torch
        class M(torch.nn.Module):
            def forward(self, x):
                if x.sum() > 0:
                    return x * 2
                return x
        def make():
            return M(), (torch.randn(3, 4),)
    """))
    module, inputs = load_model(ModelSpec(f"{f}:make"))
    with pytest.raises(HetpartError, match="torch.export could not trace the model"):
        export_model(module, inputs)
