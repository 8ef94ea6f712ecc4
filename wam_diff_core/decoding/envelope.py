"""Kinematic envelope: the fixed-style trajectory digits a decoder may commit, given the waypoints known so far.

The trajectory grammar (`constraint.TrajectoryGrammar`) fixes which characters each answer position may hold;
the envelope narrows the digits to plans a vehicle can drive. Per axis of the ego frame, the second difference of
consecutive waypoints (with the ego at waypoint 0 and, one interval earlier, at -v dt from the prompt's velocity)
is the mean acceleration over two intervals times dt^2, so with the accelerations bounded in [a_min, a_max]
(constants ENVELOPE_ACCEL_X_MPS2, ENVELOPE_LATERAL_MPS2) waypoint k, m intervals after the last two known
consecutive waypoints w_{j-1}, w_j (j = k - m), lies in

    w_j + m (w_j - w_{j-1}) + m (m + 1) / 2 dt^2 [a_min, a_max].

A waypoint is known once all characters of its number are committed; the known prefix of each axis moves as
blocks finish, so the bounds of later waypoints tighten as decoding proceeds (B = 1: always m = 1).

Digits are masked most significant first: a digit is allowed when some completion of the number's prefix with it
lies in the bound (the prefix: committed characters, else this step's best allowed prediction of the characters
before it), so whatever prefix of a number a step commits spells a value inside its bound. When no digit can
(a committed prefix that a tighter bound excludes), the digits nearest the bound stay allowed: there is always one.
Temperature sampling may draw a prefix character other than the best one the later masks assumed.
All on the device, without host synchronisation; per step a fixed loop over the number's character slots.

Forward only (`KinematicEnvelope.forward_only`): the ego does not reverse, so a plan never moves backward along the
ego's heading: each x lies at or above every committed x before it (and the ego's 0) and at or below every committed
x after it, in whatever order the block committed them. The expert's plans keep to it (none of the 8,664 plans
of the shipped recipe's data_plan and data_junction train splits steps back in x); a block decoded in parallel can mix a plan that
drives on with one that stops, x going 5.13 then 2.38 then 0.17.

Capture-ready (`KinematicEnvelope.apply_at`): the block's start is a device tensor, so one CUDA graph serves every
block. Every number is masked at every step (static shapes; a number outside the window changes nothing) and the
window's positions read their masked logits back by one gather; the forward-only second pass is computed always and
selected on the device where `apply` would run it. Same logits as `apply`, bit for bit.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Optional

import torch

from ..codec import FIXED_NUMBER_WIDTH, FIXED_TRAJECTORY_CHARS, fixed_trajectory_slots
from ..constants import (
    ENVELOPE_ACCEL_X_MPS2,
    ENVELOPE_LATERAL_MPS2,
    NUM_WAYPOINTS,
    TRAJECTORY_DECIMALS,
    WAYPOINT_DT_S,
)

_STRIDE = FIXED_NUMBER_WIDTH + 1  # a number and its separator
_NUMBERS = 2 * NUM_WAYPOINTS  # x1, y1, ..., x8, y8
ANSWER_CHARS = _NUMBERS * _STRIDE  # the answer positions the envelope reads (every number and separator)
_SCALE = 10 ** TRAJECTORY_DECIMALS  # values in integer hundredths
_PLUS, _MINUS, _POINT = 10, 11, 12  # character codes beside the digits 0..9; -1: not (yet) a trajectory character
_DIGITS = "0123456789"


def _slot_layout() -> tuple[list[int], torch.Tensor, int]:
    """Per character slot of a number: its weight in hundredths (0 for the sign and the point), the digits the
    grammar allows there ((FIXED_NUMBER_WIDTH, 10) bool), and the largest magnitude the style spells."""
    slots = fixed_trajectory_slots()[:FIXED_NUMBER_WIDTH]
    digit_slots = [q for q, chars in enumerate(slots) if set(chars) <= set(_DIGITS)]
    weights = [0] * FIXED_NUMBER_WIDTH
    for rank, q in enumerate(reversed(digit_slots)):
        weights[q] = 10 ** rank
    legal = torch.tensor([[d in chars for d in _DIGITS] for chars in slots], dtype=torch.bool)
    largest = sum(weights[q] * max(int(c) for c in slots[q]) for q in digit_slots)
    return weights, legal, largest


_WEIGHTS, _LEGAL, _LARGEST = _slot_layout()
# the slots a mask pass spells: the sign and the digits (the point has one spelling)
_SPELLED = [q for q in range(FIXED_NUMBER_WIDTH) if q == 0 or _WEIGHTS[q] > 0]


@dataclass(frozen=True)
class _Layout:
    """The numbers with a sign or digit in a window of answer positions, and where their slots lie: nums (k,) the
    numbers; rel (k, S) each spelled slot's position relative to the window's start (0 where outside); inside
    (k, S) whether it is in the window; per spelled slot j (S = len(_SPELLED)) in_any[j], whether any number has
    it inside (host bools: the loop skips the rest); sign_pairs, digit_pairs: (number index, slot index, position)
    of the slots inside, signs and digits apart, for the one scatter back."""

    nums: torch.Tensor
    rel: torch.Tensor
    inside: torch.Tensor
    in_any: tuple[bool, ...]
    sign_pairs: tuple[torch.Tensor, torch.Tensor, torch.Tensor]
    digit_pairs: tuple[torch.Tensor, torch.Tensor, torch.Tensor]


@lru_cache(maxsize=1024)
def _layout(start: int, n: int, device: str, x_only: bool = False) -> Optional[_Layout]:
    """The window start .. start + n - 1's `_Layout` (x_only: the x numbers' alone), None when no sign or digit of
    those numbers lies in it. The layout is static, so this is host arithmetic."""
    end = min(start + n, FIXED_TRAJECTORY_CHARS)
    nums = sorted({p // _STRIDE for p in range(start, end) if p % _STRIDE in _SPELLED
                   and (not x_only or p // _STRIDE % 2 == 0)})
    if not nums:
        return None
    inside = [[start <= i * _STRIDE + q < end for q in _SPELLED] for i in nums]
    rel = [[i * _STRIDE + q - start if inside[a][j] else 0 for j, q in enumerate(_SPELLED)] for a, i in enumerate(nums)]
    pairs = [(a, j, rel[a][j]) for a in range(len(nums)) for j in range(len(_SPELLED)) if inside[a][j]]

    def tensors(sel):
        return tuple(torch.tensor([p[c] for p in sel], dtype=torch.long, device=device) for c in range(3))

    return _Layout(torch.tensor(nums, device=device), torch.tensor(rel, device=device),
                   torch.tensor(inside, device=device), tuple(any(row[j] for row in inside) for j in range(len(_SPELLED))),
                   tensors([p for p in pairs if p[1] == 0]), tensors([p for p in pairs if p[1] > 0]))


@dataclass(frozen=True)
class _Window:
    """`_Layout`'s fields for a window whose start is a device tensor (every number of the layout, so the shapes are
    fixed): nums, rel (clamped into the window), inside, in_any (all True); for the gather back, per window position:
    take (n,) the index into nums and slot (n,) the spelled slot's index (both clamped), is_sign and is_digit (n,)
    whether the position holds a sign or a digit of one of nums."""

    nums: torch.Tensor
    rel: torch.Tensor
    inside: torch.Tensor
    in_any: tuple[bool, ...]
    take: torch.Tensor
    slot: torch.Tensor
    is_sign: torch.Tensor
    is_digit: torch.Tensor


@lru_cache(maxsize=16)
def _window_tables(device: str, x_only: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The layout's numbers, their spelled slots' answer positions (k, S), and each character slot's index into
    _SPELLED (-1 for the point and the separator)."""
    nums = torch.arange(0, _NUMBERS, 2 if x_only else 1, device=device)
    positions = nums[:, None] * _STRIDE + torch.tensor(_SPELLED, device=device)
    index = torch.full((_STRIDE,), -1, dtype=torch.long)
    index[_SPELLED] = torch.arange(len(_SPELLED))
    return nums, positions, index.to(device)


def _window(start: torch.Tensor, n: int, x_only: bool = False) -> _Window:
    """The `_Window` of answer positions start .. start + n - 1, start a 0-dim long tensor; tensor ops only."""
    nums, positions, index = _window_tables(str(start.device), x_only)
    rel = positions - start
    inside = (rel >= 0) & (rel < n)
    at = start + torch.arange(n, device=start.device)
    number, slot = at // _STRIDE, index[at % _STRIDE]
    held = (at < FIXED_TRAJECTORY_CHARS) & (slot >= 0) & ((number % 2 == 0) | (not x_only))
    take = (number // 2 if x_only else number).clamp(max=nums.shape[0] - 1)
    return _Window(nums, rel.clamp(0, n - 1), inside, (True,) * len(_SPELLED), take, slot.clamp(min=0),
                   held & (slot == 0), held & (slot > 0))


@lru_cache(maxsize=8)
def _tables(device: str) -> tuple[torch.Tensor, ...]:
    """Slot weights, the grammar's legal digits per slot, the acceleration bounds, the candidate digits, the
    slot indices, and the sign candidates' value ranges, on `device`."""
    return (torch.tensor(_WEIGHTS, device=device), _LEGAL.to(device), accel_bounds(device),
            torch.arange(10, device=device), torch.arange(FIXED_NUMBER_WIDTH, device=device),
            torch.tensor([0.0, -_LARGEST], device=device), torch.tensor([float(_LARGEST), 0.0], device=device))


def accel_bounds(device=None) -> torch.Tensor:
    """(2, 2) m/s^2: [[x min, x max], [y min, y max]], the envelope's acceleration range per ego axis."""
    return torch.tensor([list(ENVELOPE_ACCEL_X_MPS2), [-ENVELOPE_LATERAL_MPS2, ENVELOPE_LATERAL_MPS2]],
                        dtype=torch.float32, device=device)


def token_tables(char_ids: dict[str, int], vocab_size: int, device=None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The grammar's character token ids -> (codes, digit_ids, sign_ids): codes (vocab_size,) long, each token's
    character code (digit value, _PLUS, _MINUS, _POINT; -1 for the rest); digit_ids (10,) the ids of '0'..'9';
    sign_ids (2,) of '+', '-' (the order of the sign codes)."""
    table = torch.full((vocab_size,), -1, dtype=torch.long)
    for char, code in [(d, int(d)) for d in _DIGITS] + [("+", _PLUS), ("-", _MINUS), (".", _POINT)]:
        table[char_ids[char]] = code
    digit_ids = torch.tensor([char_ids[d] for d in _DIGITS], dtype=torch.long, device=device)
    sign_ids = torch.tensor([char_ids["+"], char_ids["-"]], dtype=torch.long, device=device)
    return table.to(device), digit_ids, sign_ids


def waypoint_bounds(values: torch.Tensor, known: torch.Tensor, velocity: torch.Tensor, accel: torch.Tensor,
                    forward_only: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Bounds (metres) of every waypoint from the known prefix of each axis.

    values, known: (batch, 2, NUM_WAYPOINTS) waypoint coordinates per axis (x, y) and whether each is known;
    velocity: (batch, 2) ego velocity (m/s); accel: (2, 2) from `accel_bounds`; forward_only: also keep each x
    between the known x before it (the ego's 0 included) and the known x after it (`forward_bounds`). -> (lo, hi),
    each (batch, 2, NUM_WAYPOINTS); only the waypoints after the known prefix are meaningful."""
    dt = WAYPOINT_DT_S
    prefix = known.long().cumprod(dim=-1).sum(dim=-1, keepdim=True)  # (batch, 2, 1) waypoints known in order
    series = torch.cat([-velocity[..., None] * dt, torch.zeros_like(velocity[..., None]), values], dim=-1)
    last = series.gather(-1, prefix + 1)  # w_P (series index i holds waypoint i - 1)
    before = series.gather(-1, prefix)  # w_{P-1}
    k = torch.arange(1, NUM_WAYPOINTS + 1, device=values.device)
    m = (k - prefix).clamp(min=1).to(values.dtype)
    reach = last + m * (last - before)
    spread = m * (m + 1) / 2 * dt * dt
    lo, hi = reach + spread * accel[:, 0, None], reach + spread * accel[:, 1, None]
    if forward_only:
        floor, ceiling = forward_bounds(values[:, 0], known[:, 0])
        lo = torch.cat([torch.maximum(lo[:, :1], floor[:, None]), lo[:, 1:]], dim=1)
        hi = torch.cat([torch.minimum(hi[:, :1], ceiling[:, None]), hi[:, 1:]], dim=1)
    return lo, hi


def forward_bounds(x: torch.Tensor, known: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x, known: (batch, NUM_WAYPOINTS) forward coordinates and whether each is committed -> (floor, ceiling),
    each (batch, NUM_WAYPOINTS): the largest known x before each waypoint (0, the ego, when none) and the smallest
    known x after it (+inf when none)."""
    inf = torch.full_like(x[:, :1], float("inf"))
    before = torch.where(known, x, -inf).cummax(dim=-1).values
    floor = torch.cat([torch.zeros_like(inf), before[:, :-1]], dim=-1).clamp(min=0.0)
    after = torch.where(known, x, inf).flip(-1).cummin(dim=-1).values.flip(-1)
    ceiling = torch.cat([after[:, 1:], inf], dim=-1)
    return floor, ceiling


@dataclass(frozen=True)
class KinematicEnvelope:
    """velocity: (batch, 2) ego vx, vy (m/s) per row; active: (batch,) bool, the rows it constrains (planning rows
    with an ego state); codes, digit_ids, sign_ids: from `token_tables`."""

    velocity: torch.Tensor
    active: torch.Tensor
    codes: torch.Tensor
    digit_ids: torch.Tensor
    sign_ids: torch.Tensor
    forward_only: bool = False  # no plan steps back along the ego's heading (module docstring)

    def apply(self, logits: torch.Tensor, start: int, answer: torch.Tensor) -> torch.Tensor:
        """logits (batch, n, vocab) predicting answer positions start .. start + n - 1; answer (batch, >= start)
        the answer's tokens so far (uncommitted positions: any token that is not a trajectory character, e.g.
        the mask) -> the logits with the digits and signs outside the envelope at -inf in the active rows.

        Forward only: a first pass masks and spells each number of the window as this step would (its best allowed
        characters); the x numbers' floors then rise to the largest x spelled or committed before them, and a
        second pass masks the x numbers again from the raw logits with those floors (the y numbers' bounds do not
        change), so numbers a step commits together do not step back either."""
        if start >= FIXED_TRAJECTORY_CHARS:
            return logits
        codes = self._codes(answer)
        lo, hi = self._bounds(codes)
        out, spelled = self._mask(logits, start, codes, lo, hi)
        x_window = _layout(start, logits.shape[1], str(logits.device), True) if self.forward_only else None
        if x_window is None or x_window.nums.shape[0] < 2:
            return out  # one x in the window at most: the committed ones' floors (in lo) are all there is
        spelled_all = (spelled[:, :, _SPELLED] >= 0).all(dim=-1)  # the point is never masked, so never spelled
        floor, _ = forward_bounds(_values(spelled)[:, 0::2], spelled_all[:, 0::2])
        lo = lo.clone()
        lo[:, 0::2] = torch.maximum(lo[:, 0::2], floor)
        return self._mask(logits, start, codes, lo, hi, out=out, x_only=True)[0]

    def apply_at(self, logits: torch.Tensor, start: torch.Tensor, answer: torch.Tensor) -> torch.Tensor:
        """`apply` with the window's start a 0-dim long tensor on the logits' device: tensor ops with shapes fixed by
        (batch, n, vocab) alone, no host read, so a captured block replays it at every start (module docstring)."""
        n = logits.shape[1]
        codes = self._codes(answer)
        lo, hi = self._bounds(codes)
        out, spelled = self._mask_window(logits, _window(start, n), codes, lo, hi, logits.clone())
        if not self.forward_only:
            return out
        x_window = _window(start, n, x_only=True)
        spelled_all = (spelled[:, :, _SPELLED] >= 0).all(dim=-1)
        floor, _ = forward_bounds(_values(spelled)[:, 0::2], spelled_all[:, 0::2])
        lo = lo.clone()
        lo[:, 0::2] = torch.maximum(lo[:, 0::2], floor)
        second = self._mask_window(logits, x_window, codes, lo, hi, out.clone())[0]
        x_numbers = x_window.inside.any(dim=-1).sum()  # `apply` runs the second pass for two or more
        return torch.where(x_numbers >= 2, second, out)

    def _mask_window(self, logits: torch.Tensor, win: _Window, codes: torch.Tensor, lo: torch.Tensor,
                     hi: torch.Tensor, out: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """`_mask` over a `_Window`: every number of it masked, the window's positions gathered back into `out`."""
        masked, cand, c = self._spell(logits, win, codes, lo, hi)
        stacked = torch.stack([torch.cat([masked[0], cand[:, :, 0, 2:]], dim=-1)] + masked[1:], dim=2)
        placed = stacked[:, win.take, win.slot]  # (batch, n, 10): each window position's masked candidates
        digits, signs = out[:, :, self.digit_ids], out[:, :, self.sign_ids]
        out[:, :, self.digit_ids] = torch.where(win.is_digit[None, :, None], placed, digits)
        out[:, :, self.sign_ids] = torch.where(win.is_sign[None, :, None], placed[..., :2], signs)
        spelled = codes.clone()
        spelled[:, win.nums] = c
        return out, spelled

    def _codes(self, answer: torch.Tensor) -> torch.Tensor:
        """(batch, numbers, slots) character codes of the committed answer (-1: not committed)."""
        b, length = answer.shape[0], _NUMBERS * _STRIDE
        tokens = answer[:, :length]
        if tokens.shape[1] < length:
            tokens = torch.cat([tokens, torch.full((b, length - tokens.shape[1]), -1, dtype=tokens.dtype,
                                                   device=tokens.device)], dim=1)
        codes = torch.where(tokens >= 0, self.codes[tokens.clamp(min=0)], -1).view(b, _NUMBERS, _STRIDE)
        return codes[:, :, :FIXED_NUMBER_WIDTH]

    def _bounds(self, codes: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(lo, hi), each (batch, numbers), in integer hundredths, from the committed numbers."""
        b = codes.shape[0]
        known = (codes >= 0).all(dim=-1)
        by_axis = (_values(codes) / _SCALE).view(b, NUM_WAYPOINTS, 2).transpose(1, 2)
        known_axis = known.view(b, NUM_WAYPOINTS, 2).transpose(1, 2)
        accel = _tables(str(codes.device))[2]
        lo, hi = waypoint_bounds(by_axis, known_axis, self.velocity.float(), accel, self.forward_only)
        lo = torch.floor(lo.transpose(1, 2).reshape(b, _NUMBERS) * _SCALE)
        hi = torch.ceil(hi.transpose(1, 2).reshape(b, _NUMBERS) * _SCALE)
        return lo, hi

    def _mask(self, logits: torch.Tensor, start: int, codes: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor,
              out: torch.Tensor | None = None, x_only: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """Mask the window's digits and signs (x_only: the x numbers' alone) of the raw `logits` to [lo, hi] slot
        by slot, most significant first, into `out` (default: a copy of `logits`) -> (out, the codes with every
        uncommitted slot of those numbers spelled by its best allowed character). The window's sign and digit
        logits are gathered once, masked on a (batch, numbers, slots, candidates) tensor and scattered back once."""
        out = logits.clone() if out is None else out
        lay = _layout(start, logits.shape[1], str(logits.device), x_only)
        if lay is None:
            return out, codes
        masked, cand, c = self._spell(logits, lay, codes, lo, hi)
        a, j, p = lay.sign_pairs
        if len(p):
            out[:, p[:, None], self.sign_ids[None, :]] = masked[0][:, a]
        a, j, p = lay.digit_pairs
        if len(p):
            stacked = torch.stack([m if m is not None else cand[:, :, 0] for m in masked[1:]], dim=2)  # (b, k, S-1, 10)
            out[:, p[:, None], self.digit_ids[None, :]] = stacked[:, a, j - 1]
        spelled = codes.clone()
        spelled[:, lay.nums] = c
        return out, spelled

    def _spell(self, logits: torch.Tensor, lay, codes: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor
               ) -> tuple[list, torch.Tensor, torch.Tensor]:
        """The masking of `lay`'s numbers (a `_Layout` or `_Window`), slot by slot, most significant first ->
        (per spelled slot its masked candidates, (batch, k, 2) for the sign, (batch, k, 10) for a digit, None where
        no number has the slot in the window; the digit candidates (batch, k, S, 10); the numbers' codes spelled)."""
        weights, legal, _, ten, slots, sign_lo, sign_hi = _tables(str(logits.device))
        cand = logits[:, lay.rel[..., None], self.digit_ids]  # (batch, k, S, 10); the sign slot's column unused
        signs = logits[:, lay.rel[:, :1], self.sign_ids]  # (batch, k, 2)
        c = codes[:, lay.nums].clone()  # (batch, k, slots)
        lo_k, hi_k = lo[:, lay.nums, None], hi[:, lay.nums, None]  # (batch, k, 1)
        idle = ~self.active[:, None, None]
        digits = c.clamp(min=0, max=9) * (weights > 0)
        sign = torch.where(c[:, :, 0] == _MINUS, -1, 1)
        masked = []
        for j, q in enumerate(_SPELLED):
            if not lay.in_any[j]:
                masked.append(None)
                continue
            if q == 0:
                vmin, vmax = sign_lo, sign_hi  # (2,): value ranges of "+" and "-"
                dist = (lo_k - vmax).clamp(min=0) + (vmin - hi_k).clamp(min=0)
                sub = signs
            else:
                w = _WEIGHTS[q]
                above = (digits * (slots < q) * weights).sum(-1)
                low = (above[..., None] + ten * w).to(lo.dtype)  # (batch, k, 10)
                high = low + (w - 1)
                s = sign[..., None]
                vmin, vmax = torch.where(s > 0, low, -high), torch.where(s > 0, high, -low)
                dist = ((lo_k - vmax).clamp(min=0) + (vmin - hi_k).clamp(min=0)).masked_fill(~legal[q], float("inf"))
                sub = cand[:, :, j]
            allowed = (dist <= dist.amin(dim=-1, keepdim=True)) | idle
            sub = sub.masked_fill(~allowed, float("-inf"))
            masked.append(sub)
            # this step's best allowed character where the slot is not committed: the prefix of the slots after
            best = sub.argmax(dim=-1)
            fill = (c[:, :, q] < 0) & lay.inside[:, j]
            c[:, :, q] = torch.where(fill, best + _PLUS if q == 0 else best, c[:, :, q])
            if q == 0:
                sign = torch.where(c[:, :, 0] == _MINUS, -1, 1)
            else:
                digits[:, :, q] = c[:, :, q].clamp(min=0, max=9)
        return masked, cand, c


def _values(codes: torch.Tensor) -> torch.Tensor:
    """(batch, numbers) the value each number's codes spell, in hundredths (uncommitted digits count as 0)."""
    weights = _tables(str(codes.device))[0]
    magnitude = (codes.clamp(min=0, max=9) * (weights > 0) * weights).sum(-1)
    return (torch.where(codes[:, :, 0] == _MINUS, -1, 1) * magnitude).float()
