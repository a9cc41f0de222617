"""The all-n chains: every link names obligations that exist, a link is PROVED only when
all of them are, and an UNKNOWN (or missing) verdict shows in the chain, never PROVED."""

from __future__ import annotations

from exactattn.proofs import chain
from exactattn.proofs.certificate import certificate
from exactattn.proofs.engine import ledger
from exactattn.proofs.families import blockmask, general, interfaces, second_order, smt

FAMILIES = {"general": general, "smt": smt, "interfaces": interfaces, "second_order": second_order}


def _outcomes(status_of=lambda ob: ledger.PROVED) -> list[ledger.Outcome]:
    obligations = [ob for module in FAMILIES.values() for ob in module.obligations()]
    return [ledger.Outcome(ob, status_of(ob), 0.0) for ob in obligations]


def test_every_link_names_obligations_of_its_families():
    names = {(ob.family, ob.name) for ob in (o.obligation for o in _outcomes())}
    for theorem in chain.THEOREMS:
        for link in theorem.links:
            assert set(link.needs) <= names, set(link.needs) - names


def test_the_chains_are_proved_when_their_obligations_are():
    text = "\n".join(chain.lines(_outcomes()))
    assert text.count(": PROVED") == 4 and "NOT" not in text
    assert "reverse (dQ, dK, dV, dB)" in text and "forward (Y and lse)" in text
    assert "second-order reverse (dQ̇, dK̇, dV̇)" in text
    assert "interfaces (varlen, paged, split-KV merge, sinks)" in text


def test_a_blockmask_or_interface_obligation_not_proved_shows_in_its_chains():
    def status_of(ob: ledger.Obligation) -> str:
        return (
            ledger.UNKNOWN
            if ob.name in (blockmask.KIND, interfaces.layouts_all_n.PAGED_GATHER)
            else ledger.PROVED
        )

    text = chain.lines(_outcomes(status_of))
    theorems = [line for line in text if line.startswith("all-n theorem")]
    assert all(line.endswith("NOT PROVED") for line in theorems), theorems
    (paged,) = [line for line in text if "paged: key t" in line]
    assert " UNKNOWN " in paged


def test_an_unknown_solver_answer_leaves_the_chain_unproved():
    def status_of(ob: ledger.Obligation) -> str:
        return ledger.UNKNOWN if ob.name == smt.LOOP[4] else ledger.PROVED

    text = chain.lines(_outcomes(status_of))
    assert text[0].endswith("NOT PROVED")
    assert " UNKNOWN " in text[2] and " PROVED " not in text[2]
    (first_reverse,) = [k for k, line in enumerate(text) if line.startswith("all-n theorem, rev")]
    assert text[first_reverse].endswith("NOT PROVED")


def test_a_family_that_did_not_run_is_not_run_in_the_chain():
    outcomes = [o for o in _outcomes() if o.obligation.family != "smt"]
    text = chain.lines(outcomes)
    assert chain.NOT_RUN in text[2] and text[0].endswith("NOT PROVED")


def test_the_certificate_lists_the_chains_the_trusted_base_and_what_is_enumerated():
    text = certificate(_outcomes(), 1.0, {}, "exactattn prove")
    assert "## The all-n chains" in text and "Trusted base" in text
    assert "What remains enumerated" in text and "Python's semantics" in text
    # verdicts that carry no record of their deciders: one decider each is assumed
    assert "z3's `unsat` alone (no record" in text and "sympy's zero test alone" in text


def test_a_second_order_visit_not_proved_leaves_its_chain_unproved():
    def status_of(ob: ledger.Obligation) -> str:
        return ledger.UNKNOWN if ob.name == second_order.SECOND_VISIT else ledger.PROVED

    text = chain.lines(_outcomes(status_of))
    (theorem,) = [line for line in text if line.startswith("all-n theorem, second-order")]
    assert theorem.endswith("NOT PROVED")
    assert [line for line in text if line.startswith("all-n theorem")][1].endswith(": PROVED")
