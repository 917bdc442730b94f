"""The leaf of ctxprec's layers: what every other package shares and that imports no other
ctxprec package — the exception tree (`errors`), constants (`constants`), every setting and its
default (`settings`, one dataclass per TOML section), the verdict record (`verdict`) and the
metric (`metric`).

Imports flow one way: `pipeline` -> `connectors` -> `storage` -> `ctxprec.storage.core`
(`tests/test_layers.py` checks it).
"""
