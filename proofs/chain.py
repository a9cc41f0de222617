"""The all-n theorems as chains of linked obligations, with each link's verdict.

Forward (for every ``n_q, n_k ≥ 1``, block size ``b ≥ 1``, row split and built-in mask,
every row with an allowed key): ``Y_i = Σ_{j∈A_i} e^{s_ij} ρ_ij V_j / Σ_{j∈A_i} e^{s_ij}``
and ``lse_i = log Σ_{j∈A_i} e^{s_ij}``. Reverse: ``dQ, dK, dV`` and ``dB`` (a score
modification's bias) are ``∂(Σ G∘Y)/∂(Q, K, V, B)`` with the frozen statistics. Each link
is a claim and the obligations that prove it (family, name); a link is PROVED when every
one of them is, and shows the first other verdict otherwise (NOT RUN when its family did
not run). Nothing here is checked again: the chain reads the run's verdicts.

The links, in order of the argument: the iterator visits every allowed ``(b, i, j)``
exactly once (so ``U_T = A_i``) ⇒ the fold over the visited tiles is the ⋆-product (φ adds
up) ⇒ each tile's summary is ``Σ_i(J_t ∩ A_i)``, for a tile of any width ⇒ the result is
the definition. The reverse replaces the fold by the sum of the visits' terms.
"""

from __future__ import annotations

from dataclasses import dataclass

from .engine.ledger import PROVED, Outcome
from .families import blockmask, general, layouts_all_n, second_order, smt

NOT_RUN = "NOT RUN"

ITERATOR = (
    ("smt", smt.LOOP[3]), ("smt", smt.LOOP[4]), ("smt", smt.LOOP[0]), ("smt", smt.LOOP[1]),
    *(("smt", name) for name in (*smt.WINDOW, *smt.PADDING, *smt.COMPOSITION)),
    *(("smt", name) for name in blockmask.NAMES),
)  # fmt: skip


@dataclass(frozen=True)
class Link:
    claim: str
    needs: tuple[tuple[str, str], ...]  # (family, obligation name)


@dataclass(frozen=True)
class Theorem:
    name: str
    statement: str
    links: tuple[Link, ...]
    chained: bool = True  # each link implies the next (⇒); else side by side results (∧)


FORWARD = Theorem(
    "forward (Y and lse)",
    "for all n_q, n_k, b, row splits, built-in masks and BlockMasks: "
    "Y_i = Σ_{A_i} e^s ρ V / Σ_{A_i} e^s, lse_i = log Σ_{A_i} e^s",
    (
        Link("tiles() visits every allowed (b, i, j) exactly once: U_T = A_i", ITERATOR),
        Link(
            "the fold over the visited tiles is the ⋆-product: φ(⊥) = 0, φ adds, rows apart",
            (
                ("general", "Lemma B: φ(a ⋆_M b) = φ(a) + φ(b), any shift M"),
                ("general", "induction base: the loop starts at ⊥, φ(⊥) = 0"),
                ("general", "Lemma R: steps are row-local; dK, dV add per row"),
            ),
        ),
        Link(
            "a tile of any width adds Σ_i(J_t ∩ A_i)'s terms to φ",
            (
                ("general", "Lemma A: e^{s−m}·e^m = e^s (exp_shifted)"),
                ("general", general.STEP_ANY_WIDTH),
            ),
        ),
        Link(
            "the result is the definition: Y = φ_z/φ_ℓ, e^lse = φ_ℓ (⊥: Y = 0, lse = −∞)",
            (("general", "Lemma C: Y = φ_z/φ_ℓ, e^lse = φ_ℓ; exact at ⊥"),),
        ),
    ),
)

REVERSE = Theorem(
    "reverse (dQ, dK, dV, dB)",
    "for all n_q, n_k, b, row splits, built-in masks and BlockMasks: "
    "dQ, dK, dV, dB = ∂(Σ G∘Y)/∂(Q, K, V, B)",
    (
        Link("tiles() visits every allowed (b, i, j) exactly once: U_T = A_i", ITERATOR),
        Link(
            "the frozen statistics give p_ij = e^{s_ij}/e^{lse_i} (the forward's lse)",
            (
                ("general", "Lemma P: p·ℓe^m = e^s for any frozen m, ℓ"),
                ("general", "Lemma C: Y = φ_z/φ_ℓ, e^lse = φ_ℓ; exact at ⊥"),
                ("general", "Lemma F: δ = G·Y = Σ_j p_j ρ_j G·V_j"),
            ),
        ),
        Link(
            "a visit of a tile of any width adds its pairs' terms of ∂L (rows apart)",
            (
                ("general", "Lemma D: ∂L/∂σ = p(ρG·V_j − δ), ∂L/∂V_j = pρG"),
                ("general", "Lemma E: chain rule through c q·k"),
                ("general", general.VISIT_ANY_WIDTH),
                ("general", "Lemma R: steps are row-local; dK, dV add per row"),
            ),
        ),
        Link(
            "a score modification pulls γ back and adds dB_ij = γ'_ij",
            (("general", "Lemma S: softcap then bias, pullback and dB = γ'"),),
        ),
    ),
)

_IFC = "interfaces"
INTERFACES = Theorem(
    "interfaces (varlen, paged, split-KV merge, sinks)",
    "for all lengths: varlen is attention per sequence, a paged cache is its contiguous "
    "keys, a merge of any partition is the whole, a sink adds e^σ to the denominator",
    (
        Link(
            "varlen: a packed batch is the block-diagonal mask; its tiles meet the contracts",
            (
                (_IFC, layouts_all_n.VARLEN_MASK),
                (_IFC, layouts_all_n.VARLEN_STRUCTURE),
                *ITERATOR[:4],
            ),
        ),
        Link(
            "paged: key t of b is read at page table[b, ⌊t/P⌋], row t mod P (then varlen)",
            ((_IFC, layouts_all_n.PAGED_GATHER), (_IFC, layouts_all_n.VARLEN_MASK)),
        ),
        Link(
            "merge: a partial is the summary (lse, 1, y); the merge folds ⋆ (φ adds)",
            (
                (_IFC, "a partial (y, lse) is the summary (lse, 1, y) under φ"),
                (_IFC, layouts_all_n.MERGE_FOLD),
                (_IFC, "the merge's exponentials have arguments ≤ 0 (no overflow)"),
                ("general", "Lemma B: φ(a ⋆_M b) = φ(a) + φ(b), any shift M"),
                ("general", "Lemma C: Y = φ_z/φ_ℓ, e^lse = φ_ℓ; exact at ⊥"),
            ),
        ),
        Link(
            "sinks: rows start at (σ, 1, 0), φ = (e^σ, 0); dσ = −Σ_i p_σ,i δ_i",
            (
                (_IFC, layouts_all_n.SINK_START),
                (_IFC, layouts_all_n.SINK_GRADIENT),
                ("general", "Lemma B: φ(a ⋆_M b) = φ(a) + φ(b), any shift M"),
                ("general", "Lemma C: Y = φ_z/φ_ℓ, e^lse = φ_ℓ; exact at ⊥"),
                ("general", "Lemma P: p·ℓe^m = e^s for any frozen m, ℓ"),
            ),
        ),
    ),
    chained=False,  # four results, each resting on the forward's and reverse's chains
)

_SEC = "second_order"
SECOND_ORDER = Theorem(
    "second-order reverse (dQ̇, dK̇, dV̇)",
    "for all n_q, n_k, b, row splits and built-in masks: (dQ̇, dK̇, dV̇) = "
    "d/dε ∂(Σ G∘Y)/∂(Q, K, V) along (Q̇, K̇, V̇, Ġ)",
    (
        Link(
            "both visits read tiles() (b read there only): every allowed pair exactly once, "
            "each tile's second visit after its rows are complete",
            (*ITERATOR, (_SEC, second_order.B_THROUGH_TILES), (_SEC, second_order.SCHEDULE)),
        ),
        Link(
            "the frozen statistics give p_ij = e^{s_ij}/e^{lse_i} (the forward's lse)",
            REVERSE.links[1].needs,
        ),
        Link(
            "the first visits add the terms of σ_i, δ̇_i and Ẏ_i; Ẏ, δ̇ are derivatives",
            (
                (_SEC, second_order.FIRST_VISIT),
                (_SEC, second_order.ROW_IDENTITIES),
                ("general", "Lemma R: steps are row-local; dK, dV add per row"),
            ),
        ),
        Link(
            "a second visit of a tile of any width adds its pairs' terms of d/dε ∂L",
            (
                (_SEC, second_order.SECOND_VISIT),
                ("general", "Lemma R: steps are row-local; dK, dV add per row"),
            ),
        ),
    ),
)

THEOREMS = (FORWARD, REVERSE, INTERFACES, SECOND_ORDER)

_ARITHMETIC = tuple(
    link
    for theorem in (FORWARD, REVERSE)
    for link in theorem.links[1:]
    if "score" not in link.claim
)
PROGRAM = Theorem(
    "a user's mask_mod (--all-n)",
    "for all n, b and row splits: the tiled forward and reverse of the program equal the "
    "definition evaluated from its mask_mod",
    (
        Link(
            "the traced mask_mod is the program (pair by pair at n ≤ N)",
            (("program", "all n: the traced mask_mod is the program"),),
        ),
        Link(
            "its tiles visit exactly its allowed pairs (default structure, the iterator)",
            (
                ("program", "all n: its structure is the default"),
                *(("smt", smt.LOOP[k]) for k in (0, 1, 3, 4)),
            ),
        ),
        Link(
            "a tile of any width: the forward's and the reverse's terms",
            tuple(dict.fromkeys(key for link in _ARITHMETIC for key in link.needs)),
        ),
        Link(
            "a BlockMask create_block_mask builds from it is sound; its tiles follow it",
            tuple(("smt", name) for name in blockmask.NAMES),
        ),
        Link(
            "its block structure (--block-mod) is sound, when one is given",
            (("program", "all n: the block structure is sound"),),
        ),
    ),
)

TRUSTED_BASE = (  # besides the deciders' shared base (:func:`proofs.agreement.trusted_base`)
    "the ctx primitives on exact numbers (the sympy backend over NumPy object arrays, and "
    "`proofs/engine/terms.py`'s exact terms for the enumerated runs: rationals that fold, sums and "
    "products collected, e^{log u} = u, 0·t = 0 and ±∞ + t = ±∞ for a finite t, the rest "
    "by sympy): rowsum and matmul are the finite sums Σ_j, rowmax is the row's max (a "
    "real, or −∞ for a row with no allowed key; the proofs take any real), where, exp and "
    "log elementwise; "
    "a tile step reads its tile only through them and elementwise operations, so one "
    "generic key j of a symbolic width w stands for every key of every width",
    "Python's semantics: the iterator's one loop `algorithm.runs` (start, then each run's "
    "end, while below the stop), a tile's dispatch reading only its kind and allowed tile, "
    "`merge.fold`'s loop, and the public API passing b to `algorithm.forward`/`backward` "
    "unchanged (which read it only through `tiles()`, an obligation)",
)

ENUMERATED = (
    "the interfaces end to end (`interfaces`): varlen at the packings it names, paged "
    "caches over every block table of its pools, merges of every partition of n ≤ 4 keys, "
    "sinks at n ≤ 2; `merge_partials` itself at k ≤ 4 free partials (all k by Lemma B); "
    "`PackedSequences`' index maps as restated from their construction (`searchsorted`)",
    "a BlockMask: torch's `create_block_mask` as restated (padding with False, a block FULL "
    "iff its sum is Q·K), and `from_block_mask`'s decoding of its index lists",
    "that `tiles()` equals the stated loop and its previous twin end to end (kinds, order, "
    f"allowed tiles): n_q, n_k ≤ {smt.LOOP_N} (the all-n proof is of its formulas)",
    "the whole iterator against the definition (`tiles`): the sizes that family names",
    "the end-to-end runs of `forward`, `reverse`, `scores`, `dropout`: batch, grouped-query "
    "heads, broadcasting, dropout's keep-bits, at the sizes they name",
    "the second-order reverse's score modifications (the soft-cap's mod″, a bias and its "
    "tangent), GQA, dropout and the end to end runs (`second_order`): the sizes it names",
    "a user's mask without proved structure (a `Mask` subclass, a `mask_mod`): its "
    "classification and row spans are checked at the enumerated sizes only",
)


def verdict(link: Link, status: dict[tuple[str, str], str]) -> str:
    """PROVED if every obligation of the link is (a name may be the start of the
    obligation's, which goes on with the program's name); else the first other verdict."""
    for family, name in link.needs:
        found = [s for (f, n), s in status.items() if f == family and n.startswith(name)]
        for got in found or [NOT_RUN]:
            if got != PROVED:
                return got
    return PROVED


def lines(outcomes: list[Outcome], theorems: tuple[Theorem, ...] = THEOREMS) -> list[str]:
    """The chains as printed after a run."""
    status = {(o.obligation.family, o.obligation.name): o.status for o in outcomes}
    out = []
    for theorem in theorems:
        verdicts = [verdict(link, status) for link in theorem.links]
        overall = PROVED if all(v == PROVED for v in verdicts) else "NOT PROVED"
        out.append(f"all-n theorem, {theorem.name}: {overall}")
        out.append(f"  {theorem.statement}")
        for k, (link, got) in enumerate(zip(theorem.links, verdicts), 1):
            arrow = "   " if k == 1 else "⇒  " if theorem.chained else "∧  "
            names = sorted({family for family, _ in link.needs})
            where = (
                f"{len(link.needs)} obligation{'s' * (len(link.needs) > 1)} ({', '.join(names)})"
            )
            out.append(f"  {arrow}{k}. {link.claim:<78} {got:<9} {where}")
    return out


def of_families(families: list[str]) -> tuple[Theorem, ...]:
    """The chains a run of ``families`` prints: the forward's and the reverse's, and the
    interfaces' and the second order's when those families ran."""
    own = {INTERFACES.name: "interfaces", SECOND_ORDER.name: _SEC}
    return tuple(t for t in THEOREMS if t.name not in own or own[t.name] in families)


def ran(families: list[str]) -> bool:
    """Whether a run of ``families`` can say anything about the chains."""
    return any(f in families for f in ("general", "smt"))


def markdown(outcomes: list[Outcome], deciders_base: list[str] = ()) -> list[str]:
    """The certificate's section: the chains, the trusted base (``deciders_base``, what the
    deciders share, first), what remains enumerated."""
    status = {(o.obligation.family, o.obligation.name): o.status for o in outcomes}
    out = ["## The all-n chains", ""]
    for theorem in THEOREMS:
        out += [f"**{theorem.name}**: {theorem.statement}.", ""]
        for k, link in enumerate(theorem.links, 1):
            needs = "; ".join(f"{family} / {name}" for family, name in link.needs)
            out.append(f"{k}. {link.claim} — **{verdict(link, status)}** ({needs})")
        out.append("")
    out += ["Trusted base (what the chains assume, not prove):", ""]
    out += [f"- {item}" for item in (*deciders_base, *TRUSTED_BASE)]
    out += ["", "What remains enumerated (checked at finite sizes only):", ""]
    out += [f"- {item}" for item in ENUMERATED]
    return out
