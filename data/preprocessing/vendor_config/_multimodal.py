"""Multimodal finetuning samples (``dataset.is_multimodal``, the llava hooks) as the vendor's tool makes them.

Release 2.10's FinetuningTokenGenerator with is_multimodal: a record's text is built as in finetuning (chat
turns through the chat template, or prompt + sep + completion + eos), an image part written as the image token
(``dataset.image_token``, default ``<special_image_token>``; registered as a special token where the tokenizer
lacks it, so vocab_size grows by one). After tokenizing, each image token becomes ``num_patches`` placeholder
tokens (pad_id; one image token itself with ``use_single_image_token``). Each sample is four arrays, one per
.h5 dataset:

- ``data`` 5 x max_seq_length: text_input_ids, loss_mask, labels, key_padding_mask (1 past the attended
  positions: the tokens but the last, as the vendor trims it), token_modality_idx (1 on the placeholders);
- ``img_path`` max_num_img byte strings (the path as the record gives it, relative to ``setup.image_dir``;
  ``b"None"`` where there is no image), ``has_img`` one bool, ``img_data_loc`` max_num_img x num_patches
  positions of the placeholders (max_seq_length where there is no image).

A record whose image is not under image_dir is skipped and counted (``raw_docs_skipped``), with a warning
naming it, as the vendor skips it; one with more images than ``max_num_img`` is dropped.
"""

from __future__ import annotations

import logging
import os
from typing import Optional

import numpy as np

from cs_run.errors import DataError, ParamsError

from ._finetuning import FinetuningSamples, _extend_to_eos, count_record
from ._pretraining import clean_and_count, sample_stats
from ._tokenizer import LoadedTokenizer

__all__ = ["FEATURES", "H5_KEYS", "MultimodalSamples"]

logger = logging.getLogger(__name__)

FEATURES = ["text_input_ids", "loss_mask", "labels", "key_padding_mask", "token_modality_idx"]
"""The rows of ``data`` (data_params.json's features)."""
H5_KEYS = ("data", "img_path", "has_img", "img_data_loc")


class MultimodalSamples(FinetuningSamples):
    """Records in (the llava hooks' turns, image parts among them), one sample of four arrays each."""

    H5_KEYS = H5_KEYS

    def __init__(self, tok: LoadedTokenizer, *, image_dir: str, image_token: str, num_patches: int,
                 max_num_img: int, use_single_image_token: bool, register_special_image_token: bool, where: str,
                 **finetuning) -> None:
        super().__init__(tok, **finetuning)
        self.image_dir = image_dir
        self.image_token = image_token
        self.max_num_img = max_num_img
        if register_special_image_token and tok.backend.token_to_id(image_token) is None:
            tok.backend.add_special_tokens([image_token])
            tok.vocab_size = tok.backend.get_vocab_size(with_added_tokens=True)
        self.image_id = tok.backend.token_to_id(image_token)
        if self.image_id is None:
            raise ParamsError(f"data preprocess --config: dataset.image_token {image_token!r} is not in the tokenizer "
                              f"and register_special_image_token is false ({where}); set it true or name a token of "
                              "the tokenizer")
        self.num_patches = 1 if use_single_image_token else num_patches
        self.placeholders = [self.image_id] if use_single_image_token else [tok.pad_id] * num_patches
        self._images: list[str] = []
        self._locs: list[tuple[int, int]] = []

    def document(self, entries: list[dict], stats: dict, where: str = "") -> list:
        """The sample one record's hook output makes (none or one); adds its counts to ``stats``."""
        if not entries:
            return []
        count_record(stats)
        chat = entries[0]["type"] not in ("prompt", "completion")
        text, messages, regions, images, length, index = "", [], [], [], 0, 0
        for turn in entries:
            role, drop = turn["type"], turn.get("semantic_drop_mask") or []
            parts = []
            for i, part in enumerate(turn["content"]):
                (key, value), = part.items()
                if not value:  # an empty turn, or an image token in a record without an image
                    stats["raw_docs_skipped"] += 1
                    return []
                dropped = drop[i] if drop else False
                if key == "image":
                    if not dropped:
                        images.append(value)
                        parts.append(self.image_token)
                        length += len(self.image_token)
                else:
                    cleaned = clean_and_count(value, self.use_ftfy, self.normalizer, stats)
                    loss = 1 if role in ("assistant", "completion") else 0
                    if not dropped and cleaned:
                        if chat:  # a marker finds the region in the rendered text, then is removed
                            marker = f"<{index}_{key}>"
                            parts.append(marker + cleaned)
                            regions.append((marker, len(cleaned), loss))
                        else:
                            parts.append(cleaned)
                            regions.append([length, length + len(cleaned), loss])
                            length += len(cleaned)
                index += 1
            content = "".join(parts)
            if chat:
                messages.append({"role": role, "content": content})
            elif role == "prompt":
                text = content + (self.sep or "")
                length += len(self.sep or "")
            elif role == "completion":
                text += content + (self.eos or "")
                length += len(self.eos or "")
        for path in images:
            if not os.path.exists(os.path.join(self.image_dir, path)):
                logger.warning("data preprocess --config: %s names the image %s, which is not there; the record is "
                               "skipped (as the vendor's tool skips it)", where, os.path.join(self.image_dir, path))
                stats["raw_docs_skipped"] += 1
                return []
        if chat:
            if not messages:
                return []
            text, spans, turn_token = self._chat_spans(messages, regions, where)
            ids, offsets = self.tok.encode(text, add_special_tokens=False)
        else:
            if not text:
                return []
            _extend_to_eos(text, regions, self.eos, self.image_token)
            spans, turn_token = regions, None
            ids, offsets = self.tok.encode(text)
        placed = self._place_images(ids, offsets, len(images), where)
        if placed is None:
            return []
        ids, offsets, self._locs = placed
        self._images, self._has_regions = images, bool(spans) or bool(self._locs)
        return self._finish(ids, offsets, spans, stats, where, turn_token)

    def _place_images(self, ids: list[int], offsets: list, n_images: int,
                      where: str) -> Optional[tuple[list[int], list, list[tuple[int, int]]]]:
        """Each image token as the placeholders (their offsets the token's), and where they are; None where the
        record has more images than max_num_img (dropped, as the vendor drops it)."""
        new_ids, new_offsets, locs = [], [], []
        n = len(self.placeholders)
        for token, offset in zip(ids, offsets):
            if token != self.image_id:
                new_ids.append(token)
                new_offsets.append(offset)
                continue
            new_ids += self.placeholders
            new_offsets += [offset] * n
            if len(locs) >= self.max_num_img:
                logger.warning("data preprocess --config: %s has more images than dataset.max_num_img %d; the record "
                               "is dropped (as the vendor's tool drops it)", where, self.max_num_img)
                return None
            if len(locs) >= n_images:
                raise DataError(f"data preprocess --config: {where} has the image token {self.image_token!r} in its "
                                f"text beyond its {n_images} image(s); remove it from the text")
            locs.append((len(new_ids) - n, len(new_ids)))
        return new_ids, new_offsets, locs

    def _sample(self, ids: list[int], mask: list[int], stats: dict) -> list:
        """The kept record's five rows and its image arrays, counted."""
        msl, n = self.msl, len(ids) - 1
        mask = list(mask)
        for start, end in self._locs:  # the image regions: no loss
            mask[start:end] = [0] * (end - start)
        data = np.zeros((5, msl), dtype=np.int32)
        data[0] = ids[:-1] + [self.tok.pad_id] * (msl - n)
        data[1, :n] = mask[1:]
        data[2] = ids[1:] + [self.tok.pad_id] * (msl - n)
        attended = len(ids) - 1 if self._has_regions else len(ids)  # the vendor trims the last token's attention
        data[3, attended:] = 1
        locations = np.full((self.max_num_img, self.num_patches), msl, dtype=np.int32)
        for i, (start, end) in enumerate(self._locs):
            data[4, start:end] = 1
            locations[i] = np.arange(start, end)
        if self.inverted_mask:
            data[1] = data[1] == 0
        sample_stats(data, self.tok, msl, stats)
        paths = [p.encode("utf-8") for p in self._images] + [None] * (self.max_num_img - len(self._images))
        return [(data, np.array(paths, dtype="S"), np.array([bool(self._images)]), locations)]
