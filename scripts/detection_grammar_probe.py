"""Probe: a box-list grammar for block decoding, applied to a shipped model without retraining.

    .venv/bin/python scripts/detection_grammar_probe.py --model models/nano-s-b32 \\
        --data runs/nano_s/data_all/val.json --samples 200 --out runs/grammar_probe/b32.json

The trajectory grammar masks by position alone, which works because a fixed-style trajectory has one role per
answer position. A box answer's numbers have 1 to 4 digits, so a position does not say what it holds; this probe
instead walks the answer left to right through a token automaton of the box list
`[{"bbox_2d":[x1,y1,x2,y2],"label":"car"},...]` (canonical tokens only; integers 0..1000 without leading zeros,
x2 >= x1, y2 >= y1; the labels of the training data; a closing `]` and EOS within the budget), and makes the
block's commits left to right: every position of a block is one chain (`remasking.commit_mask`), so a step commits
the first masked position and the confident run after it, and the last step the rest. At each step the masked
positions of the block are constrained along the greedy path the automaton takes through this step's logits, so
whatever is committed is the automaton's path. The decode costs the same forwards as the unconstrained one (K
steps a block). Scored with `wam-diff evaluate`'s detection scores. A probe, not a product path: the state walk is
a Python loop per step.
"""
from __future__ import annotations

import argparse
import json
from functools import lru_cache
from pathlib import Path

import torch

from wam_diff_core.evaluate import decode_task, score_detection
from wam_diff_core.evaluate_data import load_task
from wam_diff_core.policy import DrivingPolicy, with_budget

PIECES = {"open": '[{"', "bbox": "bbox", "us": "_", "two": "2", "d": "d", "coords": '":[', "comma": ",",
          "end_coords": '],"', "label": "label", "colon": '":"', "next": '"},{"', "close_box": '"}', "lbr": "[",
          "rbr": "]"}
KEY = ("bbox", "us", "two", "d", "coords")
AFTER_COORDS = ("label", "colon")
BOX_TOKENS = 1 + len(KEY) + 4 * 3 + 3 + len(AFTER_COORDS) + 2  # a box of 3-digit numbers, its separators included


@lru_cache(maxsize=None)
def number_prefixes(lo: int) -> tuple[frozenset, frozenset]:
    """(the integers lo..1000 as JSON writes them, every prefix of one of them)."""
    full = frozenset(str(v) for v in range(lo, 1001))
    return full, frozenset(v[:i] for v in full for i in range(len(v) + 1))


class BoxAutomaton:
    """The state of one answer walked token by token; `allowed()` the token ids that may come next."""

    def __init__(self, ids: dict, digit_ids: dict, label_ids: list[int], eos: int, budget: int):
        self.ids, self.digit_ids, self.label_ids, self.eos, self.budget = ids, digit_ids, label_ids, eos, budget
        self.char_of = {v: k for k, v in digit_ids.items()}
        self.stage, self.k, self.nums, self.num, self.pos, self.dead = "start", 0, [], "", 0, False

    def copy(self) -> "BoxAutomaton":
        new = object.__new__(BoxAutomaton)
        new.__dict__.update(self.__dict__)
        new.nums = list(self.nums)
        return new

    def _lo(self) -> int:
        return self.nums[len(self.nums) - 2] if len(self.nums) >= 2 else 0

    def allowed(self) -> list[int]:
        ids, st = self.ids, self.stage
        if self.dead or st == "done":
            return [self.eos]
        if st == "start":
            return [ids["open"], ids["lbr"]]
        if st == "empty":
            return [ids["rbr"]]
        if st == "key":
            return [ids[KEY[self.k]]]
        if st == "num":
            valid, prefixes = number_prefixes(self._lo())
            out = [self.digit_ids[c] for c in "0123456789" if self.num + c in prefixes]
            if self.num in valid:
                out.append(ids["comma"] if len(self.nums) < 3 else ids["end_coords"])
            return out
        if st == "after":
            return [ids[AFTER_COORDS[self.k]]]
        if st == "label":
            return list(self.label_ids)
        if st == "box_end":
            room = self.budget - self.pos - 1 >= BOX_TOKENS + 2
            return [ids["next"], ids["close_box"]] if room else [ids["close_box"]]
        if st == "list_end":
            return [ids["rbr"]]
        return [self.eos]  # "eos"

    def step(self, tok: int) -> None:
        if self.dead or tok not in self.allowed():
            self.dead = True
            return
        self.pos += 1
        ids, st = self.ids, self.stage
        if st == "start":
            self.stage, self.k = ("key", 0) if tok == ids["open"] else ("empty", 0)
        elif st == "empty":
            self.stage = "eos"
        elif st == "key":
            self.k += 1
            if self.k == len(KEY):
                self.stage, self.nums, self.num = "num", [], ""
        elif st == "num":
            if tok in self.char_of:
                self.num += self.char_of[tok]
            else:
                self.nums.append(int(self.num))
                self.num = ""
                if tok == ids["end_coords"]:
                    self.stage, self.k = "after", 0
        elif st == "after":
            self.k += 1
            if self.k == len(AFTER_COORDS):
                self.stage = "label"
        elif st == "label":
            self.stage = "box_end"
        elif st == "box_end":
            self.stage, self.k = ("key", 0) if tok == ids["next"] else ("list_end", 0)
        elif st == "list_end":
            self.stage = "eos"
        elif st == "eos":
            self.stage = "done"


class BoxGrammar:
    """A duck-typed `decoding.constraint.TokenConstraint` for rows that answer the detection prompt."""

    envelope = True  # the decoder hands `apply` the answer so far only when a constraint has an envelope

    def __init__(self, tokenizer, eos: int, mask: int, budget: int, labels=("car",)):
        def one(text):
            got = tokenizer(text, add_special_tokens=False)["input_ids"]
            if len(got) != 1:
                raise ValueError(f"{text!r} is {len(got)} tokens")
            return got[0]

        self.ids = {k: one(v) for k, v in PIECES.items()}
        self.digit_ids = {c: one(c) for c in "0123456789"}
        self.label_ids = [one(label) for label in labels]
        self.eos, self.mask, self.budget = eos, mask, budget
        self.batch = 1

    def for_batch(self, batch: int) -> "BoxGrammar":
        self.batch = batch
        return self

    def chains(self, start: int, n: int) -> torch.Tensor:
        return torch.zeros((self.batch, n), dtype=torch.long)  # one chain: commits extend the block's prefix

    def apply(self, logits: torch.Tensor, start: int, answer: torch.Tensor) -> torch.Tensor:
        logits = logits.clone()
        for r in range(logits.shape[0]):
            auto = BoxAutomaton(self.ids, self.digit_ids, self.label_ids, self.eos, self.budget)
            for tok in answer[r, :start].tolist():
                auto.step(tok)
            for i, tok in enumerate(answer[r, start:start + logits.shape[1]].tolist()):
                if tok == self.mask:
                    keep = torch.tensor(auto.allowed())
                    row = torch.full_like(logits[r, i], float("-inf"))
                    row[keep] = logits[r, i, keep]
                    logits[r, i] = row
                    tok = int(row.argmax())
                auto.step(tok)
        return logits


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--samples", type=int, default=200)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--steps", type=int, default=None, help="K (default: the checkpoint's own)")
    ap.add_argument("--out", required=True, type=Path)
    args = ap.parse_args()
    policy = DrivingPolicy.load(args.model, steps=args.steps)
    samples = load_task(args.data, "detection", args.samples, policy.loaded.settings.prompt_route_targets)
    cfg = with_budget(policy.config, ("detection",))
    settings = policy.loaded.settings
    grammar = BoxGrammar(policy.processor.tokenizer, settings.eos_token_id, settings.mask_token_id, cfg.max_new_tokens)
    import wam_diff_core.evaluate as ev

    # every row of this run answers the detection prompt; argument 2 is the batch's tasks
    ev.planning_constraint = lambda *a, **k: grammar.for_batch(len(a[2]))
    answers, seconds = decode_task(policy, samples, cfg, args.batch_size)
    scores = score_detection(policy, samples, answers, cfg.max_new_tokens)
    out = {"model": args.model, "samples": len(samples), "decoding": {"block_size": cfg.block_size, "steps": cfg.steps,
           "strategy": cfg.strategy}, "decode_seconds": seconds, "unfinished": sum(not a.finished for a in answers),
           **scores, "predictions": [{"id": s.sample_id, "text": a.text} for s, a in zip(samples, answers)]}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2))
    print(json.dumps({k: v for k, v in out.items() if k != "predictions"}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
