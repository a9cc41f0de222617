"""Precision experiments: how far floating-point runs of the tiled algorithm drift.

* :mod:`.formats` — number formats (mantissa bits, exponent range, ulp, unit roundoff u);
* :mod:`.metrics` — max abs, max rel, RMSE, mean / max ulp error against a reference;
* :mod:`.inputs` — deterministic input distributions (normal, FA-3 outliers, large logits);
* :mod:`.configs` — the precision configurations (NumPy, mpmath, torch, FP8), as data;
* :mod:`.reference` — the certified reference (:mod:`exactattn.certified`) as the sweep uses it;
* :mod:`.bound` — the first-order forward error bound (``docs/error_bound.md``);
* :mod:`.presets`, :mod:`.runner` — the sweep grid and how it runs (:mod:`exactattn.executors`);
* :mod:`.plots`, :mod:`.report`, :mod:`.cli` — outputs and ``exactattn sweep``.
"""
