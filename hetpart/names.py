"""Names the CLI checks before it imports torch (NOTE [arguments before torch] in cli.py).

`hetpart.models.ZOO` builds its entries from nn.Module code, so importing it imports
torch; this tuple lists the same names without it, in the same order
(tests/export/test_fast_cli.py keeps the two equal).
"""

ZOO_NAMES = ("mlp", "glm", "resnet", "vit", "unet", "lstm", "gpt-small", "llama", "moe", "bert", "t5", "hgnn",
             "llama-7b", "llama-70b", "llama-405b")
