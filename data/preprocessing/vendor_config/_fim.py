"""Fill-in-the-middle pretraining samples (``dataset.training_objective: fim``) as the vendor's tool makes them.

Each pretraining sample (packed or not, see _pretraining) is rearranged; the rules are the vendor's
(Release 2.10 FIMTokenGenerator and utils.fim), written down so a change is seen:

* the sample's input ids are cut at every eos token (a pad equal to eos cuts too) into segments; empty
  segments before an eos are skipped, the one after the last eos is kept even when empty;
* per segment, numpy's legacy global RNG (seeded once with ``processing.seed``, drawn in sample then
  segment order) draws ``binomial(1, fim_rate)``; on a hit the segment is decoded to text, two cuts are
  drawn with ``randint(0, len(text) + 1, size=2)`` and sorted, prefix / middle / suffix are re-encoded and
  ``binomial(1, spm_rate)`` picks SPM (else PSM); on a miss the segment stays as it is (AR);
* the sample is brought back to its length: extra tokens come off the end of suffixes, then the start of
  prefixes, then of middles, one segment at a time in turn; missing ones are pad tokens after the last
  segment, masked out;
* PSM is ``<pre> p <suf> s <mid> m eos``, SPM ``<pre> <suf> s <mid> p m eos``, AR ``tokens eos``; inputs
  are all but the last token, labels all but the first, the mask 1 but over the added padding;
* the packed rest written last (``*_prefix.h5``) is not rearranged; the token counts are the rearranged
  samples'.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from cs_run.errors import ParamsError

from ._pretraining import PretrainingSamples, sample_stats

__all__ = ["FimSamples"]

_TOKEN_KEYS = ("num_pad_tokens", "non_pad_tokens", "num_tokens", "loss_valid_tokens", "num_masked_tokens",
               "n_examples")


class FimSamples(PretrainingSamples):
    """Pretraining samples, each rearranged for fill-in-the-middle."""

    def __init__(self, tok, *, fim: tuple, where: str, **kwargs) -> None:
        super().__init__(tok, **kwargs)
        self.fim_rate, self.spm_rate = fim[0], fim[1]
        ids = []
        for name in fim[2:]:
            token_id = tok.backend.token_to_id(name)
            if token_id is None:
                raise ParamsError(f"data preprocess --config: the FIM token {name!r} is not in the tokenizer "
                                  f"({where}); add it to the tokenizer or name one it has")
            ids.append(token_id)
        self.prefix_id, self.middle_id, self.suffix_id = ids
        self.np_rng = np.random.RandomState(kwargs["seed"])  # the vendor's np.random.seed(seed), same stream

    def document(self, entries: list[dict], stats: dict, where: str = "") -> list[np.ndarray]:
        """As pretraining, each sample rearranged; the token counts are the rearranged samples'."""
        inner: dict = defaultdict(int)
        samples = super().document(entries, inner, where)
        for key, value in inner.items():
            if key not in _TOKEN_KEYS:
                stats[key] += value
        out = [self._rearrange(s, where) for s in samples]
        for sample in out:
            sample_stats(sample, self.tok, self.msl, stats)
        return out

    def _segment(self, ids: np.ndarray) -> tuple[list[list[int]], str]:
        """One segment as [prefix, middle, suffix] token lists and its format (AR keeps it whole as suffix)."""
        if not self.np_rng.binomial(1, self.fim_rate):
            return [[], [], ids.tolist()], "AR"
        text = self.tok.backend.decode(ids.tolist(), skip_special_tokens=False)
        cuts = sorted(self.np_rng.randint(low=0, high=len(text) + 1, size=2))
        parts = [self.tok.encode(t)[0] for t in (text[: cuts[0]], text[cuts[0]: cuts[1]], text[cuts[1]:])]
        return parts, "SPM" if self.np_rng.binomial(1, self.spm_rate) else "PSM"

    def _rearrange(self, sample: np.ndarray, where: str) -> np.ndarray:
        ids, eos, pad = sample[0], self.tok.eos_id, self.tok.pad_id
        segments = []
        start = 0
        for loc in np.flatnonzero(ids == eos):
            if loc > start:
                segments.append(self._segment(ids[start:loc]))
            start = loc + 1
        segments.append(self._segment(ids[start:]))
        total = sum(len(part) for parts, _ in segments for part in parts)
        extra = total - 1 + sum(1 if fmt == "AR" else 4 for _, fmt in segments) - self.msl
        padding = 0
        if extra >= 0:
            self._truncate([parts for parts, _ in segments], extra)
        else:
            padding = -extra
        seq: list[int] = []
        for parts, fmt in segments:
            p, m, s = parts
            if fmt == "PSM":
                seq += [self.prefix_id, *p, self.suffix_id, *s, self.middle_id, *m, eos]
            elif fmt == "SPM":
                seq += [self.prefix_id, self.suffix_id, *s, self.middle_id, *p, *m, eos]
            else:
                seq += [*p, *m, *s, eos]
        seq += [pad] * padding
        if seq[-1] != eos:
            # the vendor's tool stops with an AssertionError here ("did not end with an EOS token")
            raise ParamsError(f"data preprocess --config: a FIM sample of {where} re-tokenizes shorter than "
                              f"max_seq_length and its padding ({pad}) is not eos ({eos}); the Model Zoo's tool "
                              "stops on it too: set processing.pad_id equal to eos_id, or leave out this record")
        out = np.empty((3, self.msl), dtype=np.int32)
        out[0] = seq[:-1]
        out[1] = [1] * (self.msl - padding) + [0] * padding
        out[2] = seq[1:]
        return out

    @staticmethod
    def _truncate(groups: list[list[list[int]]], extra: int) -> None:
        """Take ``extra`` tokens off: the end of suffixes, then the start of prefixes, then of middles,
        one segment after another in turn."""
        where = [2] * len(groups)
        i = 0
        while extra:
            part = groups[i][where[i]]
            if part:
                part.pop(-1 if where[i] == 2 else 0)
                extra -= 1
            else:
                where[i] = (where[i] + 1) % 3
            i = (i + 1) % len(groups)
