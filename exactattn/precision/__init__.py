"""Precision experiments: how far floating-point runs of the tiled algorithm drift.

* :mod:`.configs` — the precision configurations (NumPy, mpmath, torch, FP8, emulated
  formats), views of the target registry, with the arithmetic :mod:`exactattn.error.bounds`
  bounds;
* :mod:`.grid` — a preset's grid points over the case model's fields;
* :mod:`.tasks` — one problem's reference, one point's runs and their bound ratios;
* :mod:`.presets`, :mod:`.sweep_run` — the sweep grid and how it runs
  (:mod:`exactattn.infra.executors`);
* :mod:`.golden`, :mod:`.fa3_paper`, :mod:`.emulator_bench` — the runs that answer Golden et
  al.'s questions, FA-3 §4.3 at its shapes, the emulator's speed;
* :mod:`.plots`, :mod:`.sweep_report`, :mod:`.lowbit_report`, :mod:`.timing` — outputs.

Errors are measured with :mod:`exactattn.error.metrics` against the certified reference
(:mod:`exactattn.cases.exact`); ``exactattn sweep`` is :mod:`exactattn.commands.sweep`.
"""
