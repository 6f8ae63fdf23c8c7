"""Adaptive speculation: what each row may draft, and how wide each verify step is.

Speculation must never cost more than it saves. A verify step of width T feeds
T tokens for EVERY row of the batch (padding included), and on a CPU a step with
more than one token in the whole batch costs far more than a one-token step
(matrix-vector vs matrix-matrix kernels; measured: jobs/results/code-choices.md,
"stages/decoding/adaptive.py, module docstring"). So the engine decides per step:

1. ``DraftLengths`` (per row, following its recent acceptance): the row may ask
   for ``k`` drafts; ``k`` starts at ``k_init``, grows by ``grow`` after a fully
   accepted draft, shrinks to accepted + 1 after a rejection; when the row's
   recent acceptance rate (decayed accepted / drafted) drops below
   ``pause_below`` the row stops asking (k = 0) for ``pause_steps`` steps (doubling
   on each consecutive pause) and then probes again with k = 1.
2. ``AcceptanceModel`` (shared by all rows, learned online): acceptance depends
   mostly on how long a suffix the draft matched (n): measured on the sample
   corpus, P(first draft token accepted) is ~0.2 for n = 1 and ~0.65 for n >= 3.
   Per n it learns p_first and the continuation rate alpha (P(next accepted |
   previous accepted)); a draft of length L is then expected to yield
   ``p_first * (1 + alpha + ... + alpha^(L-1))`` accepted tokens.
3. ``StepCost``: step seconds ~ ``a + c * M + j * h(M)`` for M tokens fed in the
   whole batch, fitted online (decayed least squares around a device prior) from
   the engine's own timed steps (engine_state.EngineState holds one per actor), so
   each actor learns its hardware. The prior and ``h``, the kernel-cost shape,
   come from the device's step backend (backends/): the indicator ``[M > 1]``.
4. ``choose_width``: the T saving the most expected decode time for the batch,
   which ends with its last row (accepted tokens of rows that will finish early
   save little; see the function), and T = 1 (plain decoding) unless speculation
   saves ``min_gain - 1`` of the step's cost beyond breaking even. Rows then fill
   their slots up to T - 1 with drafts (padding is computed anyway). Every
   ``Tuning.explore_every`` drafting steps the step is one width wider than chosen
   (``explore_width``), so the models keep learning at the margin they decide on.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Tuning:
    """Engine knobs that are not user-facing (defaults measured with `longdoc bench decode`,
    pipeline/bench/suite.py; results under jobs/results/)."""

    k_init: int = 8
    grow: int = 4
    k_floor: int = 1  # a rejection shrinks k to max(k_floor, accepted + 1)
    pause_below: float = 0.1
    pause_steps: int = 4
    min_gain: float = 1.05  # a wider step must promise this much more throughput
    # Every this many drafting steps, feed one width more than the models choose
    # (explore_width), so both keep learning: a model that never sees a wider step or an
    # accepted 1-gram draft never changes its mind.
    explore_every: int = 16


class DraftLengths:
    """Per-row draft cap following the row's recent acceptance (see module docstring).

    Rows are any hashable keys (the engine's row ids); a row's state is made on its
    first use and dropped by ``forget`` when the row leaves.
    """

    def __init__(self, k_max: int, tuning: Tuning) -> None:
        self.k_max = k_max
        self.t = tuning
        self._rows: dict[Hashable, _RowDrafts] = {}

    def _row(self, r: Hashable) -> _RowDrafts:
        row = self._rows.get(r)
        if row is None:
            row = self._rows[r] = _RowDrafts(k=min(self.k_max, self.t.k_init), backoff=self.t.pause_steps)
        return row

    def allowed(self, r: Hashable) -> int:
        """Drafts row r may ask for this step (0 while paused); counts a pause down."""
        row = self._row(r)
        if row.paused > 0:
            row.paused -= 1
            if row.paused == 0:
                row.k = 1  # probe again
            return 0
        return row.k

    def update(self, r: Hashable, drafted: int, accepted: int) -> None:
        """Record a verify step of row r: ``drafted`` tokens fed, ``accepted`` of them kept."""
        if drafted == 0:
            return
        row = self._row(r)
        row.acc = 0.7 * row.acc + accepted
        row.drafted = 0.7 * row.drafted + drafted
        if accepted == drafted:
            row.k = min(self.k_max, max(row.k, drafted) + self.t.grow)
            row.backoff = self.t.pause_steps
        else:
            row.k = min(self.k_max, max(self.t.k_floor, accepted + 1))
        if row.drafted >= 8 and row.acc < self.t.pause_below * row.drafted:
            row.paused = row.backoff
            row.backoff = min(64, 2 * row.backoff)
            row.k = 0
            row.acc = row.drafted = 0.0  # judge the probe on its own

    def forget(self, r: Hashable) -> None:
        """Row r left the engine."""
        self._rows.pop(r, None)


@dataclass
class _RowDrafts:
    k: int  # drafts the row may ask for
    backoff: int  # length of the next pause
    acc: float = 0.0  # decayed accepted drafts
    drafted: float = 0.0  # decayed drafted tokens
    paused: int = 0  # steps left without drafting


# Prior P(first draft token accepted) by matched suffix length n (sample corpus).
_P_FIRST = (0.0, 0.2, 0.3, 0.6, 0.7, 0.8, 0.85, 0.9, 0.9)
_MAX_N = len(_P_FIRST) - 1

#: What a drafter reports with each draft: the matched context length ``n`` (an int),
#: or ``(source, n)`` for a drafter with several sources whose acceptance differs
#: (drafters.Draft.level); acceptance is learned per level.
Level = Hashable


def _matched_length(level: Level) -> int:
    n = level[1] if isinstance(level, tuple) else level
    return min(int(n), _MAX_N)


class AcceptanceModel:
    """Per draft level (matched length n, or (source, n)): decayed counts behind p_first and alpha."""

    def __init__(self, prior_weight: float = 4.0, decay: float = 0.995) -> None:
        self.decay = decay
        self.prior_weight = prior_weight
        self.first: dict[Level, list[float]] = {}  # level -> [accepted, tried]
        self.cont: dict[Level, list[float]] = {}

    def _counts(self, level: Level) -> tuple[list[float], list[float]]:
        key = (level[0], _matched_length(level)) if isinstance(level, tuple) else _matched_length(level)
        if key not in self.first:
            w, n = self.prior_weight, _matched_length(level)
            self.first[key] = [w * _P_FIRST[n], w]
            self.cont[key] = [w * 0.7, w]
        return self.first[key], self.cont[key]

    def rates(self, level: Level) -> tuple[float, float]:
        f, c = self._counts(level)
        return f[0] / f[1], c[0] / c[1]

    def expected(self, level: Level, length: int) -> float:
        """Expected accepted tokens of a draft of `length` tokens at this level."""
        if length <= 0 or _matched_length(level) <= 0:
            return 0.0
        p, a = self.rates(level)
        geo = float(length) if a >= 1.0 else (1.0 - a**length) / (1.0 - a)
        return p * geo

    def expected_min(self, levels: list[Level], lengths: list[int]) -> float:
        """E[min accepted] over independent rows (drafts of ``lengths`` at ``levels``).

        P(accepted >= k) = p_first * alpha^(k-1) for k <= length, so
        E[min] = sum_k prod_rows P(accepted_row >= k).
        """
        if not lengths or min(lengths) <= 0 or min(_matched_length(x) for x in levels) <= 0:
            return 0.0
        rates = [self.rates(x) for x in levels]
        total, k = 0.0, 1
        while k <= min(lengths):
            prob = 1.0
            for p, a in rates:
                prob *= p * a ** (k - 1)
            total += prob
            k += 1
        return total

    def update(self, level: Level, drafted: int, accepted: int) -> None:
        if drafted == 0 or _matched_length(level) <= 0:
            return
        d = self.decay
        f, c = self._counts(level)
        f[0], f[1] = d * f[0] + (accepted > 0), d * f[1] + 1
        if accepted > 0:
            # After the first: accepted - 1 successes, plus one failure if it stopped early.
            judged = accepted - 1 + (1 if accepted < drafted else 0)
            c[0], c[1] = d * c[0] + accepted - 1, d * c[1] + judged


def step_indicator(m: int) -> float:
    """Default kernel-cost shape: any step wider than one token pays a jump."""
    return 1.0 if m > 1 else 0.0


class StepCost:
    """Step seconds ~ a + c * M + j * h(M) for M fed tokens (see module docstring).

    ``prior = (c/a, j/a)`` sets the shape before measurements arrive; the first
    measured step sets the scale. Prior pseudo-points stay in every fit (a ridge),
    so the model stays defined while only one kind of step has been seen.
    Observations far off the model (another process stealing the CPU) are clipped.
    """

    def __init__(
        self, prior: tuple[float, float], forget: float = 0.97, shape: Callable[[int], float] = step_indicator
    ) -> None:
        self.prior = prior
        self.forget = forget
        self.shape = shape
        self._xtx = [[0.0] * 3 for _ in range(3)]
        self._xty = [0.0] * 3
        self._ptx: list[list[float]] | None = None
        self._pty: list[float] = [0.0] * 3
        self._fit: tuple[float, float, float] | None = None  # solved once per observation

    def _features(self, m: int) -> list[float]:
        return [1.0, float(m), self.shape(m)]

    def observe(self, fed: int, seconds: float) -> None:
        self._fit = None
        if self._ptx is None:
            r, j = self.prior
            a = seconds / (1.0 + r * fed + j * self.shape(fed))
            self._ptx = [[0.0] * 3 for _ in range(3)]
            # Light pseudo-points (a few percent of the decayed data weight): they only
            # keep the fit defined and lean it towards the prior shape.
            for m in (1, 2, 4, 8, 32):
                x, y = self._features(m), a * (1.0 + r * m + j * self.shape(m))
                for i in range(3):
                    self._pty[i] += 0.25 * x[i] * y
                    for k in range(3):
                        self._ptx[i][k] += 0.25 * x[i] * x[k]
            return
        pred = self.predict(fed)
        self._fit = None
        y = min(max(seconds, 0.3 * pred), 3.0 * pred)
        x = self._features(fed)
        f = self.forget
        for i in range(3):
            self._xty[i] = f * self._xty[i] + x[i] * y
            for k in range(3):
                self._xtx[i][k] = f * self._xtx[i][k] + x[i] * x[k]

    def coefficients(self) -> tuple[float, float, float]:
        if self._ptx is None:
            r, j = self.prior
            return 1.0, r, j
        if self._fit is None:
            m = [[self._xtx[i][k] + self._ptx[i][k] for k in range(3)] + [self._xty[i] + self._pty[i]] for i in range(3)]  # noqa: E501
            a, c, j = _solve3(m)
            self._fit = max(a, 1e-6), max(c, 0.0), max(j, 0.0)
        return self._fit

    def predict(self, fed: int) -> float:
        a, c, j = self.coefficients()
        return a + c * fed + j * self.shape(fed)


def _solve3(m: list[list[float]]) -> tuple[float, float, float]:
    """Gaussian elimination on a 3x4 augmented matrix (normal equations, SPD)."""
    for col in range(3):
        piv = max(range(col, 3), key=lambda r: abs(m[r][col]))
        m[col], m[piv] = m[piv], m[col]
        if abs(m[col][col]) < 1e-18:
            return 1.0, 0.0, 0.0
        for r in range(col + 1, 3):
            f = m[r][col] / m[col][col]
            m[r] = [m[r][k] - f * m[col][k] for k in range(4)]
    x = [0.0, 0.0, 0.0]
    for r in (2, 1, 0):
        x[r] = (m[r][3] - sum(m[r][k] * x[k] for k in range(r + 1, 3))) / m[r][r]
    return x[0], x[1], x[2]


def choose_width(
    lengths: list[int],
    ngrams: list[int],
    model: AcceptanceModel,
    cost: StepCost,
    min_gain: float,
    remaining: list[int] | None = None,
    candidates: Sequence[int] | None = None,
    fed_rows: int | None = None,
    refilling: bool = False,
) -> int:
    """Step width T (1 + most drafts fed by a row) saving the most decode time.

    A batch decodes until its LAST row finishes, so accepted drafts are worth
    different amounts (seconds saved, against ``cost`` of the wider step):
    - every accepted token ends its row one step sooner, saving that row's share
      of later steps: ``mu`` = marginal cost of one row in a one-token step;
    - only when every critical row (most tokens ``remaining``, within 2) accepts
      does the whole batch need one step fewer: ``E[min accepted over critical
      rows]`` steps of cost(|critical|), less the ``mu`` already counted.
    At batch size 1 this is: expected accepted tokens x the cost of a step.
    ``remaining`` defaults to all rows critical. The step is widened only when it
    saves ``min_gain - 1`` of its own cost beyond breaking even.
    ``candidates``: the widths allowed (default every width 2..longest + 1; the engine
    passes its width buckets on CUDA); ``fed_rows``: rows a step computes (default the
    rows drafting; a bucketed step computes its whole batch bucket, padding rows too).
    ``refilling``: requests are waiting to take the slot of any row that finishes, so
    the batch does not wait for its slowest row: the width maximises tokens per second
    (an accepted token is worth the step's cost per row) and the critical-row term is
    dropped (continuous batching).
    """
    longest = max(lengths, default=0)
    if longest == 0:
        return 1
    rows = len(lengths)
    remaining = remaining if remaining is not None else [0] * rows
    top = max(remaining)
    critical = [] if refilling else [i for i, r in enumerate(remaining) if r >= top - 2]
    fed = fed_rows or rows
    base = cost.predict(fed)
    if refilling:
        # Throughput, not the batch's end: the step makes `rows` tokens for `base`
        # seconds, so an accepted draft is worth base / rows (wider pays iff
        # (rows + accepted) / wide > rows / base).
        mu = base / rows
    else:
        mu = (cost.predict(rows) - cost.predict(1)) / (rows - 1) if rows > 1 else 0.0
    batch_step = max(cost.predict(len(critical)) - mu * len(critical), 0.0) if critical else 0.0
    best_t, best_net = 1, 0.0
    if candidates is None:
        widths: Sequence[int] = range(2, longest + 2)
    else:  # up to the first candidate holding the longest draft (its padding gets drafts too)
        top = min((w for w in candidates if w >= longest + 1), default=max(candidates))
        widths = [w for w in candidates if 1 < w <= top]
    for width in widths:
        caps = [min(m, width - 1) for m in lengths]
        saved = mu * sum(model.expected(n, c) for c, n in zip(caps, ngrams, strict=True))
        if critical:
            saved += batch_step * model.expected_min([ngrams[i] for i in critical], [caps[i] for i in critical])
        wide = cost.predict(fed * width)
        net = saved - (wide - base) - (min_gain - 1.0) * wide
        if net > best_net:
            best_t, best_net = width, net
    return best_t


def explore_width(chosen: int, longest: int, candidates: Sequence[int] | None = None) -> int:
    """The width of an exploring step: the next width past ``chosen`` (the models' choice),
    within the width that holds the longest draft (``longest + 1``, or the first of the
    backend's width buckets ``candidates`` that holds it; None = any width).

    Why one step past the choice and not the widest: it teaches the acceptance and cost
    models about the margin they decide on, at the price of a slightly wider step. The
    widest step teaches about widths far from any choice and can cost several ordinary
    steps: on the sample job, exploring at the widest widths cost more than drafting saved
    (measured: jobs/results/code-choices.md, "stages/decoding/adaptive.py explore_width").
    """
    top = longest + 1
    if candidates is not None:
        top = min((w for w in candidates if w >= top), default=max(candidates))
        wider = [w for w in candidates if chosen < w <= top]
        return min(wider) if wider else chosen
    return max(chosen, min(chosen + 1, top))


def default_cost_prior(accelerator: bool, linear_shape: bool = False) -> tuple[float, float]:
    """(c/a, j/a) of StepCost before measurements, measured on SmolLM2-135M.

    A CPU step grows ~6% of a one-token step per extra token and jumps ~70% once it feeds
    more than one (h = the indicator); an accelerator's step barely grows at these sizes.
    ``linear_shape``: h is the measured cost shape of the linear layers (the CPU-native
    backend's linear plan); they are about two thirds of a CPU step, and attention and the
    rest grow ~2% of a one-token step per extra token.
    """
    if accelerator:
        return (0.002, 0.0)
    return (0.02, 0.67) if linear_shape else (0.06, 0.7)
