"""Check any attention implementation against the certified reference (``exactattn check``).

A kernel author adds one line to their test suite::

    from exactattn.testing import assert_attention_close

    def test_my_kernel():
        assert_attention_close(my_attention, convention="sdpa", examples=200)

Cases are drawn by hypothesis (every mask kind the convention expresses and their and/or
compositions, both alignments, ``n_q ≠ n_k``, GQA, ``v ≠ d``, large logits, outliers,
non-contiguous inputs, each dtype the target takes); the forward, the gradients and the
log-sum-exp (when returned) are judged against the certified reference within the bound
derived from the claimed arithmetic (``claim="input=fp16,scores=fp32,stats=fp32,p=fp16,
acc=fp32,block=128"``; default: the input dtype throughout, block size unstated = the worst
case); a failure is shrunk to a minimal counterexample. The modules: :mod:`.tolerance` (the
claimed arithmetic's bound), :mod:`.judge`, :mod:`.suspicion` (an ok case far outside its
expected error is ``SUSPICIOUS``, never failed), :mod:`.case_check` (one case through every
variant), :mod:`.search` (the hypothesis search), :mod:`.probes` (foreign dropout),
:mod:`.session` and :mod:`.check_report`; masks and dropout from their definitions are
:mod:`exactattn.cases.spec`, the reference :mod:`exactattn.cases.exact`.
"""

from __future__ import annotations

from typing import Any

__all__ = ["assert_attention_close"]


def assert_attention_close(
    fn: Any,
    *,
    convention: str = "sdpa",
    examples: int = 100,
    grads: bool = True,
    seed: int = 0,
    dtypes: tuple[str, ...] | None = None,
    claim: Any = None,
    supports: Any = None,
    max_n: int = 12,
    max_d: int | None = 8,
    device: str = "cpu",
    dropout_probe: bool = True,
) -> Any:
    """Raise ``AssertionError`` with the counterexample unless ``fn`` is exact enough.

    ``convention``: ``sdpa`` (default), ``flash``, ``exactattn`` or ``hf`` (see
    :mod:`exactattn.targets.conventions`); ``claim``: a :class:`~exactattn.targets.Claim`
    or its text; ``supports``: a :class:`~exactattn.targets.Capabilities` or its text
    (``masks=none+causal,gqa=no,dropout=no``), so cases ``fn`` does not take are skipped
    rather than failed; ``max_n``, ``max_d``: the size caps (``max_d=None``: the field's head
    dims, 64 to 256). Fails as well when every case was skipped (nothing was checked).
    Returns the :class:`~exactattn.testing.session.Result`.
    """
    from .. import targets
    from .check_report import counterexample
    from .session import Settings, run

    if isinstance(claim, str):
        claim = targets.Claim.parse(claim)
    if isinstance(supports, str):
        supports = targets.Capabilities.parse(supports, targets.user_capabilities(convention))
    target = targets.from_callable(fn, convention=convention, claim=claim, supports=supports)
    settings = Settings(
        examples=examples,
        dtypes=dtypes,
        max_n=max_n,
        max_d=max_d,
        grads=grads,
        seed=seed,
        device=device,
        determinism=False,
        baselines=False,
        probes=dropout_probe,
    )
    result = run([target], settings)
    problems = [counterexample(f, text) for f, text in result.report.failures]
    problems += [f"dropout probe {p.target}: {p.detail}" for p in result.probes if not p.ok]
    problems += [f"{name}: unavailable ({why})" for name, why in result.unavailable.items()]
    if problems:
        raise AssertionError("\n".join(problems))
    ran = sum(c[s] for c in result.report.counts.values() for s in ("ok", "refused"))
    if not ran:
        reasons = {why for c in result.report.skips.values() for why in c}
        reasons |= {f"does not take {', '.join(d)}" for d in result.unsupported_dtypes.values()}
        raise AssertionError(
            f"no case was checked: every case was skipped ({'; '.join(sorted(reasons))})"
        )
    return result
