"""Precision experiments: how far floating-point runs of the tiled algorithm drift.

* :mod:`.formats` — number formats (mantissa bits, exponent range, ulp, unit roundoff u);
* :mod:`.metrics` — max abs, max rel, RMSE, mean / max ulp error against a reference;
* :mod:`.inputs` — deterministic input distributions (normal, FA-3 outliers, large logits);
* :mod:`.configs` — the precision configurations (NumPy, mpmath, torch, FP8, emulated
  formats), views of the target registry, with the arithmetic :mod:`exactattn.bounds` bounds;
* :mod:`.reference` — the certified reference (:mod:`exactattn.certified`) as the sweep uses it;
* :mod:`.tasks` — one problem's reference, one point's runs and their bound ratios;
* :mod:`.presets`, :mod:`.runner` — the sweep grid and how it runs (:mod:`exactattn.executors`);
* :mod:`.golden` — the runs that answer Golden et al.'s questions;
* :mod:`.plots`, :mod:`.report`, :mod:`.cli` — outputs and ``exactattn sweep``.
"""
