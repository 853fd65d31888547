"""The issue's expected results, judged from a latency sweep's cells (``arli bench
latency-sweep``): each claim (a target, the gain over the anchored start, the controls, the
latency-unaware comparison, the ideal reference, the ablations, do no harm) holds, fails or is
unresolved by where its interval lies against its threshold. Success intervals are two-level
bootstraps over training seeds x the shared test episodes and differences are paired
(``arli.stats``). A later look at the same claims on more training seeds (``looks``) is
judged at a wider level."""

from __future__ import annotations

import numpy as np

from arli.bench.common import rounded, rounded_interval
from arli.stats import gain_ci, success_ci, verdict

IDEAL = "standard_d0"  # the ideal reference: latency-unaware RL without latency
TARGETS = {0: 0.95, 4: 0.95, 8: 0.90}  # arli@d >= target (ceiling - CEILING_MARGIN where the ceiling is lower)
CEILING_MARGIN = 0.03
MIN_GAIN = 0.05  # arli over its anchored start, at every delay
CONTROL_MARGIN = 0.05  # arli over bc_control / uniform_control, at every delay > 0
STANDARD_GAP = 0.20  # standard@4 <= arli@4 - STANDARD_GAP
IDEAL_MARGIN = 0.03  # arli@4 >= standard@0 - IDEAL_MARGIN
ABLATION_DELAY = 8
CONTROLS = ("bc_control", "uniform_control")
ABLATIONS = ("arli_no_committed", "arli_no_midobs")

VERDICT_ERROR = 0.05  # a first look's chance of a false verdict per claim (its intervals are 95%)


def verdict_level(looks: int) -> float:
    """The confidence level the ``looks``-th look at the same claims (on a growing set of
    training seeds) is judged at: 1 - 0.05 / looks, so that look's own chance of a false
    verdict per claim is about 0.05 / looks and, by the union bound, all looks together stay
    below about 0.05 * (1 + 1/2 + ... + 1/looks): 7.5% over two (the first look, at 95%,
    cannot be taken back)."""
    return 1 - VERDICT_ERROR / looks


def looks_error(looks: int) -> float:
    """The union bound on a false verdict per claim over ``looks`` looks judged at
    ``verdict_level``: 0.05 * (1 + 1/2 + ... + 1/looks)."""
    return VERDICT_ERROR * sum(1 / n for n in range(1, looks + 1))


def level_name(level: float) -> str:
    """95 for 0.95, 97.5 for 0.975: the suffix of an interval's key (``ci95``, ``ci97.5``)."""
    return f"{level * 100:.4g}"


def paired_difference(a: dict, b: dict, level: float | None = None) -> dict | None:
    """mean(a) - mean(b) with its paired 95% interval (``ci95``) and the interval a verdict
    judges (``ci``: at ``level``, or the 95% one when None), on the training seeds both cells
    have and their shared test episodes (a base-alone ``b``, one row with no seed: its
    outcomes stand for every seed of ``a``, the base does not depend on one)."""
    seeds = sorted(set(a["_outcomes"]) & set(b["_outcomes"]))
    if seeds:
        x = np.array([a["_outcomes"][s] for s in seeds], float)
        y = np.array([b["_outcomes"][s] for s in seeds], float)
    elif not b["seeds"]:  # the base alone
        x = np.array(list(a["_outcomes"].values()), float)
        y = np.array([next(iter(b["_outcomes"].values()))], float)
    else:
        return None
    ci95 = rounded_interval(gain_ci(x, y))
    return {"mean": rounded(x.mean() - y.mean()), "ci95": ci95,
            "ci": ci95 if level is None else rounded_interval(gain_ci(x, y, level=level)), "seeds": seeds}


def _mean(cell: dict | None) -> float | None:
    return None if cell is None else cell["success_mean"]


def _get(cell: dict | None, key: str):
    return None if cell is None else cell[key]


HOLDS, FAILS, UNRESOLVED, NOT_EVALUATED = "holds", "fails", "unresolved", "not evaluated"


def at_least(ci: list[float], threshold: float) -> bool | None:
    """The claim "quantity >= threshold" judged by the quantity's interval
    (``arli.stats.verdict``): True when the whole interval is above it, False when the whole
    interval is below it, None (unresolved) when it straddles or touches the threshold."""
    return {"above": True, "below": False, "unresolved": None}[verdict(tuple(ci), threshold)]


def below(ci: list[float], threshold: float) -> bool | None:
    """The claim "quantity < threshold", judged as ``at_least`` (its mirror)."""
    flipped = at_least(ci, threshold)
    return None if flipped is None else not flipped


def verdicts(cells: list[dict], ceiling: list[dict], delays: list[int], base: str | None,
             looks: int = 1) -> list[dict]:
    """The issue's expected results, each judged by an interval (95% at a first look, else
    ``verdict_level(looks)``): ``status`` is ``holds`` (the
    interval clears the claim), ``fails`` (the interval is entirely on the wrong side),
    ``unresolved`` (it straddles the claim's threshold) or ``not evaluated`` (a cell it needs is
    missing); ``holds`` is True / False for the first two, None otherwise. The gain rule keeps
    the issue's own wording (mean >= margin and the interval above 0; its values say whether
    the interval's lower end clears the margin too); "not below the base" is a do-no-harm
    rule that fails only where the interval shows harm. ``delays``: the
    sweep's delays (the rules "at every delay" run at these and at 0, 4 and 8). A partial
    cell (fewer training seeds than the sweep's) counts as missing: no verdict rests on it.
    At a later look each verdict's values also give the interval it was judged on (``ci97.5``,
    ``gain_ci97.5``, ``difference_ci97.5`` at the second) beside the 95% one, and
    ``ci_lower_clears_margin`` reads the judged gain interval. ``base``: the base-alone variant
    of the residual's loop (``base_naive`` ...), None where none runs in it."""
    if base is not None and not base.startswith("base_"):
        raise ValueError(f"base: a base-alone variant (base_sync, base_naive, base_rtc) or None, got {base!r}")
    level = None if looks == 1 else verdict_level(looks)
    judged = "" if level is None else f"ci{level_name(level)}"

    def success_at(c: dict) -> list[float]:
        """The cell's judged success interval (its seeds' finals, in seed order as ``ci95``)."""
        if level is None:
            return c["ci95"]
        return rounded_interval(success_ci(np.array(list(c["_outcomes"].values()), float), level=level))

    def gain_at(c: dict) -> list[float]:
        if level is None:
            return c["gain_ci95"]
        finals = np.array(list(c["_outcomes"].values()), float)
        starts = np.array([c["_start_outcomes"][s] for s in c["_outcomes"]], float)
        return rounded_interval(gain_ci(finals, starts, level=level))

    def shown(values: dict, key: str, ci) -> dict:
        """``values`` with the judged interval under ``key`` at a later look, right after its
        95% counterpart (``difference_ci97.5`` after ``difference_ci95``)."""
        if not judged:
            return values
        assert key.replace(judged, "ci95") in values, f"{key} has no 95% counterpart in {list(values)}"
        out = {}
        for k, v in values.items():
            out[k] = v
            if k == key.replace(judged, "ci95"):
                out[key] = ci
        return out

    by = {(c["variant"], c["delay_steps"]): c for c in cells if c.get("complete", True)}
    ceil = {c["delay_steps"]: c["success"] for c in ceiling}
    every = sorted({*TARGETS, *delays})
    out = []

    def rule(claim: str, family: str, needs: list, check, values: dict) -> None:
        """``check()`` -> True / False / None (holds / fails / unresolved); it runs only when
        every cell in ``needs`` exists."""
        if any(n is None for n in needs):
            status = NOT_EVALUATED
        else:
            status = {True: HOLDS, False: FAILS, None: UNRESOLVED}[check()]
        out.append({"claim": claim, "family": family, "status": status,
                    "holds": {HOLDS: True, FAILS: False}.get(status), "values": values})

    def versus(a: dict | None, b: dict | None) -> dict | None:
        return None if a is None or b is None else paired_difference(a, b, level)

    for d, nominal in TARGETS.items():
        c, top = by.get(("arli", d)), ceil.get(d)
        target = round(top - CEILING_MARGIN, 4) if top is not None and top < nominal else nominal
        ci = None if c is None else success_at(c)
        rule(f"arli@{d} >= {nominal:.2f} (ceiling@{d} - {CEILING_MARGIN:.2f} where the ceiling is lower; "
             "judged by its CI)", "target",
             [c], lambda ci=ci, t=target: at_least(ci, t),
             shown({f"arli@{d}": _mean(c), "ci95": _get(c, "ci95"), f"ceiling@{d}": top, "target": target},
                   judged, ci))
    for d in every:
        c = by.get(("arli", d))
        g = None if c is None else gain_at(c)

        def gain(c=c, g=g) -> bool | None:
            if c["gain_mean"] >= MIN_GAIN and at_least(g, 0.0):
                return True
            return False if at_least(g, MIN_GAIN) is False else None

        rule(f"arli@{d} - start@{d} >= {MIN_GAIN:+.2f}, gain CI excludes 0 (the issue's rule; fails: CI below "
             f"{MIN_GAIN:+.2f})", "gain_over_start", [c], gain,
             shown({f"arli@{d}": _mean(c), f"start@{d}": _get(c, "start_mean"), "gain": _get(c, "gain_mean"),
                    "gain_ci95": _get(c, "gain_ci95"),
                    "ci_lower_clears_margin": None if c is None else bool(at_least(g, MIN_GAIN))},
                   f"gain_{judged}", g))
    for control in CONTROLS:
        for d in (d for d in every if d > 0):
            a, b = by.get(("arli", d)), by.get((control, d))
            diff = versus(a, b)
            rule(f"arli@{d} >= {control}@{d} + {CONTROL_MARGIN:.2f} (paired CI of the difference)", "controls",
                 [diff], lambda x=diff: at_least(x["ci"], CONTROL_MARGIN),
                 shown({f"arli@{d}": _mean(a), f"{control}@{d}": _mean(b), "difference": _get(diff, "mean"),
                        "difference_ci95": _get(diff, "ci95")}, f"difference_{judged}", _get(diff, "ci")))
    a4, s4 = by.get(("arli", 4)), by.get(("standard", 4))
    diff = versus(a4, s4)
    rule(f"standard@4 <= arli@4 - {STANDARD_GAP:.2f} (paired CI of arli - standard)", "standard",
         [diff], lambda x=diff: at_least(x["ci"], STANDARD_GAP),
         shown({"arli@4": _mean(a4), "standard@4": _mean(s4), "difference": _get(diff, "mean"),
                "difference_ci95": _get(diff, "ci95")}, f"difference_{judged}", _get(diff, "ci")))
    s0 = by.get(("standard", 0), by.get((IDEAL, 0)))  # the ideal reference: standard_d0 when d = 0 is not swept
    diff = versus(a4, s0)
    rule(f"arli@4 >= standard@0 - {IDEAL_MARGIN:.2f} (paired CI of arli@4 - standard@0)", "ideal",
         [diff], lambda x=diff: at_least(x["ci"], -IDEAL_MARGIN),
         shown({"arli@4": _mean(a4), "standard@0": _mean(s0), "difference": _get(diff, "mean"),
                "difference_ci95": _get(diff, "ci95")}, f"difference_{judged}", _get(diff, "ci")))
    d = ABLATION_DELAY
    for ablation in ABLATIONS:
        a, b = by.get(("arli", d)), by.get((ablation, d))
        diff = versus(b, a)
        rule(f"{ablation}@{d} < arli@{d} (paired CI of {ablation} - arli below 0)", "ablations",
             [diff], lambda x=diff: below(x["ci"], 0.0),
             shown({f"arli@{d}": _mean(a), f"{ablation}@{d}": _mean(b), "difference": _get(diff, "mean"),
                    "difference_ci95": _get(diff, "ci95")}, f"difference_{judged}", _get(diff, "ci")))
    label = base or "the base alone (no base-alone variant runs in this chunking.strategy's loop)"
    for d in every:
        a, b = by.get(("arli", d)), by.get((base, d))
        diff = versus(a, b)
        # do no harm: it fails only where the interval shows harm
        rule(f"arli@{d} not below {label}@{d} (paired CI of arli - base not entirely below 0)", "not_below_base",
             [diff], lambda x=diff: below(x["ci"], 0.0) is not True,
             shown({f"arli@{d}": _mean(a), f"{base}@{d}": _mean(b), "difference": _get(diff, "mean"),
                    "difference_ci95": _get(diff, "ci95")}, f"difference_{judged}", _get(diff, "ci")))
    return out


def _value(key: str, v) -> str:
    if v is None:
        return f"{key} missing"
    if isinstance(v, bool):
        return f"{key}: {'yes' if v else 'no'}"
    if isinstance(v, list):
        return f"{key} [{v[0]:+.3f}, {v[1]:+.3f}]" if "difference" in key or "gain" in key else \
            f"{key} [{v[0]:.3f}, {v[1]:.3f}]"
    return f"{key} = {v:+.3f}" if key in ("gain", "difference") else f"{key} = {v:.3f}"


def verdict_markdown(checks: list[dict], budget: int, looks: int = 1) -> str:
    labels = {HOLDS: "holds", FAILS: "does NOT hold", UNRESOLVED: "unresolved (the interval straddles it)",
              NOT_EVALUATED: "not evaluated"}
    lines = [f"* `{c['claim']}`: **{labels[c['status']]}** ({', '.join(_value(k, v) for k, v in c['values'].items())})"
             for c in checks]
    count = {s: sum(c["status"] == s for c in checks) for s in labels}
    level = level_name(verdict_level(looks))
    why = "" if looks == 1 else (
        f" (look {looks} at these claims, on a growing set of training seeds: this look is judged at "
        f"1 - {VERDICT_ERROR:g} / {looks}, so its own chance of a false verdict per claim is about {100 - float(level):.3g}%, and over the "
        f"{looks} looks at most about {100 * looks_error(looks):.3g}% by the union bound)")
    return (f"Expected results (the issue's targets), at budget {budget} env steps per run, each judged by a {level}% "
            f"interval{why}: {count[HOLDS]} hold, {count[FAILS]} do not, {count[UNRESOLVED]} unresolved, "
            f"{count[NOT_EVALUATED]} not evaluated (a cell they need is missing). "
            f"Intervals: {level}% two-level bootstrap over training seeds x the shared test episodes"
            + (" (shown with the table's 95% intervals)" if looks > 1 else "") + "; "
            "differences paired on the same seeds and episodes.\n\n" + "\n".join(lines) + "\n")
