#!/usr/bin/env python3
"""Writes the seed corpora in fuzz/corpus/<target>/ (small, hand-made starting points).

The seeds give libFuzzer valid inputs of each shape to mutate from, and ctest replays them in
every build (fuzz_replay.<target>). The byte layouts of safetensors_roundtrip and
attention_module follow FuzzInput's encoding (fuzz/fuzz.h) and the order of the reads in each
target; a seed that no longer matches still decodes (into another case), so regenerate after
changing a target's reads. Files named crash-* in a corpus are reproducers of past findings,
kept by hand, not written here.

Run from the repository root:  python3 fuzz/make_seeds.py
Deterministic: a re-run writes the same bytes. Needs only the Python standard library.
"""
import gzip
import json
import pathlib
import struct

CORPUS = pathlib.Path(__file__).resolve().parent / "corpus"
FIXTURE = pathlib.Path(__file__).resolve().parent.parent / "tests/core/fixtures/python_written.safetensors"


def write(target, name, data):
    folder = CORPUS / target
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_bytes(data)


# --- FuzzInput encoding -------------------------------------------------------------------
class Bytes:
    def __init__(self):
        self.out = bytearray()

    def byte(self, value):
        self.out.append(value & 0xFF)
        return self

    def flag(self, value):
        return self.byte(1 if value else 0)

    def in_range(self, lo, hi, value):
        assert lo <= value <= hi, (lo, hi, value)
        raw, span = value - lo, hi - lo
        if span < 256:
            self.out.append(raw)
        elif span < 65536:
            self.out += struct.pack("<H", raw)
        else:
            self.out += struct.pack("<Q", raw)
        return self

    def pick(self, count, index):
        return self.in_range(0, count - 1, index)

    def u64(self, value):
        self.out += struct.pack("<Q", value)
        return self

    def text(self, max_length, value):
        self.in_range(0, max_length, len(value))
        self.out += value
        return self

    def raw(self, data):
        self.out += data
        return self


# --- safetensors_parse: files ---------------------------------------------------------------
def safetensors_file(tensors, metadata=None):
    """tensors: list of (name, dtype, shape, bytes) in data order."""
    header, offset = {}, 0
    if metadata:
        header["__metadata__"] = metadata
    for name, dtype, shape, data in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + b"".join(t[3] for t in tensors)


def safetensors_parse():
    t = "safetensors_parse"
    write(t, "python_written.safetensors", FIXTURE.read_bytes())
    write(t, "empty.safetensors", safetensors_file([]))
    write(t, "f32_with_metadata.safetensors",
          safetensors_file([("weight", "F32", [2, 3], struct.pack("<6f", 1, -2, 0.5, 0, 3e38, -1e-45))],
                           {"format": "pt"}))
    write(t, "every_dtype.safetensors", safetensors_file([
        ("a", "BOOL", [3], bytes([1, 0, 1])), ("b", "U8", [2], bytes([0, 255])), ("c", "I8", [2], bytes([128, 127])),
        ("d", "I16", [1], struct.pack("<h", -32768)), ("e", "I32", [], struct.pack("<i", 7)),
        ("f", "I64", [1, 1], struct.pack("<q", -1)), ("g", "F16", [2], struct.pack("<2H", 0x3C00, 0x7E00)),
        ("h", "BF16", [2], struct.pack("<2H", 0x3F80, 0xFF80)), ("i", "F64", [0, 4], b""),
        ("j", "F32", [1], struct.pack("<f", float("inf")))]))
    # Near misses, each one rule broken (the unit tests hold the full table).
    ok = safetensors_file([("a", "F32", [2], bytes(8)), ("b", "F32", [1], bytes(4))])
    write(t, "trailing_byte.safetensors", ok + b"\0")
    write(t, "truncated.safetensors", ok[:-1])
    header = b'{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"a":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}}'
    write(t, "duplicate_key.safetensors", struct.pack("<Q", len(header)) + header + bytes(12))
    header = b'{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}'
    write(t, "overlap.safetensors", struct.pack("<Q", len(header)) + header + bytes(8))
    # Untrusted text: names and metadata with terminal escape sequences (ESC [2J, ESC ]0;...BEL),
    # C1 CSI and bidi overrides (json.dumps writes them as \u escapes, the parser decodes them),
    # and headers that are not UTF-8, so that messages quote them (check_printable_message).
    clear, retitle, csi, rlo = "\x1b[2J", "\x1b]0;x\x07", "\u009b", "\u202e"
    write(t, "escape_accepted_names.safetensors", safetensors_file(
        [(clear, "BOOL", [2], bytes([1, 2])), (retitle + csi, "F32", [1], struct.pack("<f", 0.5))],
        {clear + rlo: retitle + csi}))
    q = json.dumps  # a JSON string literal, with \u escapes for everything but printable ASCII
    f32 = '"dtype":"F32","shape":[1]'
    for name, text in [
        ("escape_duplicate_name",
         '{%s:{%s,"data_offsets":[0,4]},%s:{%s,"data_offsets":[4,8]}}' % (q(clear), f32, q(clear), f32)),
        ("escape_unknown_dtype",
         '{%s:{"dtype":%s,"shape":[1],"data_offsets":[0,8]}}' % (q(retitle), q(csi + clear))),
        ("escape_unexpected_field", '{"a":{%s,"data_offsets":[0,8],%s:1}}' % (f32, q(rlo + retitle))),
        ("escape_metadata_not_a_string", '{"__metadata__":{%s:[%s]}}' % (q(clear + csi), q(retitle)))]:
        write(t, name + ".safetensors", struct.pack("<Q", len(text)) + text.encode() + bytes(8))
    # nlohmann's parse error quotes the bytes it read last, raw: a C1 character, then 0xFF.
    header = b'{"\xc2\x9b\xff\x1b[2J":1}'
    write(t, "escape_header_not_utf8.safetensors", struct.pack("<Q", len(header)) + header)


# --- safetensors_roundtrip: FuzzInput bytes -------------------------------------------------
DTYPES = ["BOOL", "U8", "I8", "I16", "I32", "I64", "F16", "BF16", "F32", "F64"]
SIZES = [1, 1, 1, 2, 4, 8, 2, 2, 4, 8]


def roundtrip_case(tensors, metadata, through_disk):
    b = Bytes().in_range(0, 5, len(tensors))
    for name, dtype, shape, data in tensors:
        b.text(12, name).in_range(0, 9, DTYPES.index(dtype)).in_range(0, 4, len(shape))
        count = 1
        for d in shape:
            b.in_range(0, 6, d)
            count *= d
        assert len(data) == count * SIZES[DTYPES.index(dtype)]
        b.raw(data)
    b.in_range(0, 3, len(metadata))
    for key, value in metadata:
        b.text(8, key).text(16, value)
    return bytes(b.flag(through_disk).out)


def safetensors_roundtrip():
    t = "safetensors_roundtrip"
    write(t, "nothing", b"")
    write(t, "floats_and_metadata", roundtrip_case(
        [(b"query", "F32", [2, 3], struct.pack("<6f", 1, -2, 0.5, 0, float("nan"), -0.0)),
         (b"half", "F16", [3], struct.pack("<3H", 0x3C00, 0x0001, 0x7C01)),
         (b"bf", "BF16", [1, 1, 1, 2], struct.pack("<2H", 0x3F80, 0x7FC1))],
        [(b"format", b"pt"), (b"note", "\u00fcnic\u00f6de".encode())], True))
    write(t, "integers_scalars_empty", roundtrip_case(
        [(b"", "I64", [], struct.pack("<q", -(2**63))), (b"mask", "BOOL", [2, 2], bytes([1, 0, 0, 1])),
         (b"empty", "U8", [0, 3], b""), (b"i8", "I8", [3], bytes([0x80, 0, 0x7F])),
         (b"i16", "I16", [2], struct.pack("<2h", -1, 300))], [], False))
    # Names that must be quoted escaped: a BOOL byte 2 refused under an ESC name, a name that is
    # not UTF-8 refused by serialize.
    write(t, "escape_names", roundtrip_case(
        [(b"\x1b[2J", "BOOL", [2], bytes([1, 2])), (b"\x1b]0;x\x07\xc2\x9b", "U8", [1], bytes([7]))],
        [(b"\x1b[2J", "\u202e\u2066".encode())], False))
    write(t, "escape_not_utf8", roundtrip_case([(b"\xff\x1b[2J", "I8", [1], bytes([1]))], [], False))
    write(t, "bad_names", roundtrip_case([(b"__metadata__", "F64", [1], bytes(8)), (b"\xff", "I32", [1], bytes(4))],
                                         [(b"\xc0\x80", b"overlong")], False))


# --- idx_reader: a selector byte (images even, labels odd; then num_classes) and the file ----
def idx(magic, dims, data):
    return struct.pack(">I", magic) + b"".join(struct.pack(">I", d) for d in dims) + data


def idx_reader():
    t = "idx_reader"
    images = idx(0x803, [2, 3, 3], bytes(range(18)))
    labels = idx(0x801, [4], bytes([0, 9, 3, 1]))
    write(t, "images", b"\x00" + images)
    write(t, "images_gzip", b"\x00" + gzip.compress(images, mtime=0))
    write(t, "labels", b"\x01\x0a" + labels)
    write(t, "labels_gzip", b"\x01\x0a" + gzip.compress(labels, mtime=0))
    write(t, "labels_out_of_range", b"\x01\x05" + labels)
    # zlib's own message in the error: the first deflate block has the invalid type 3.
    corrupt = bytearray(gzip.compress(images, mtime=0))
    corrupt[10] = 0xFF
    write(t, "images_gzip_corrupt", b"\x00" + bytes(corrupt))


# --- attention_module: FuzzInput bytes (the order of the reads in attention_module.cpp) ------
def sdpa_case(shape_mode, dims, masks=((0, None), (0, None)), causal=0, scale=0, dropout=0, need_weights=False,
              magnitude=0, fractions=(200, 30), fill=0, specials=(), damage=None):
    b = Bytes().flag(False).in_range(0, 7, shape_mode)
    if shape_mode == 7:
        huge = [0, 1, 2, 3, 1 << 20, 1 << 31, 1 << 32, 1 << 40, 1 << 62, (1 << 63) - 1]
        for d in dims:  # B, Hkv, Hq, L, S, Dqk, Dv
            b.pick(len(huge), huge.index(d))
    elif shape_mode == 5:
        hq, length, keys, dqk, dv = dims
        b.in_range(1, 2, hq).in_range(0, 300, length).in_range(0, 600, keys).in_range(0, 20, dqk).in_range(0, 20, dv)
    else:
        batch, hkv, group, length, keys, dqk, dv = dims
        b.in_range(0, 3, batch).in_range(0, 3, hkv).in_range(1, 3, group)
        for d in (length, keys, dqk, dv):
            b.in_range(0, 70, d)
    if shape_mode == 6:
        which, how, extra = damage
        b.in_range(0, 3, which).in_range(0, 2, how)
        if how == 1:
            b.in_range(0, 3, extra)
        if how == 2:
            b.in_range(0, 3, extra[0]).in_range(0, 5, extra[1])
    for kind, spec in masks:  # attend, additive
        b.in_range(0, 2, kind)
        if kind == 1:  # spec: flags for the broadcast dims, innermost last
            b.in_range(1, 4, len(spec))
            for full in spec:
                b.flag(full)
        elif kind == 2:  # spec: the shape
            b.in_range(0, 5, len(spec))
            for d in spec:
                b.in_range(0, 4, d)
    b.pick(3, causal).in_range(0, 7, scale).pick(9, dropout).u64(1234).flag(need_weights)
    b.u64(42).pick(5, magnitude).byte(fractions[0]).byte(fractions[1]).pick(5, fill)
    b.in_range(0, 3, len(specials))
    for tensor, at, value in specials:  # tensor: q k v dout additive; value: index into special_value's list
        b.in_range(0, 4, tensor).in_range(0, 65535, at).pick(10, value)
    return bytes(b.out)


def module_case(embed_dim, heads, N, L, S, dropout=0, bias=True, add_bias_kv=False, add_zero_attn=False, kdim=0,
                vdim=0, batch_first=False, training=False, unbatched=False, attn_2d=True, padding_kind=0, attn_kind=0,
                need_weights=True, average=True, is_causal=False, magnitude=0, fractions=(220, 30), fill=0,
                specials=()):
    b = Bytes().flag(True).in_range(0, 16, embed_dim).in_range(0, 4, heads).pick(7, dropout).flag(bias)
    b.flag(add_bias_kv).flag(add_zero_attn).in_range(0, 12, kdim).in_range(0, 12, vdim).flag(batch_first)
    b.flag(training).u64(7).in_range(0, 3, N).in_range(0, 12, L).in_range(0, 12, S).flag(unbatched).flag(attn_2d)
    b.in_range(0, 7, 3)  # no damaged shape
    b.in_range(0, 2, padding_kind).in_range(0, 2, attn_kind).flag(need_weights).flag(average).flag(is_causal)
    b.u64(99).pick(5, magnitude).byte(fractions[0]).byte(fractions[1]).pick(5, fill).u64(5)
    b.in_range(0, 3, len(specials))
    for tensor, at, value in specials:  # tensor: q k v key_padding_mask attn_mask
        b.in_range(0, 4, tensor).in_range(0, 65535, at).pick(10, value)
    return bytes(b.out)


def attention_module():
    t = "attention_module"
    write(t, "sdpa_gqa_masks", sdpa_case(0, (2, 2, 2, 7, 9, 8, 5), masks=((1, (True, False, True)), (1, (True, True))),
                                         causal=1, need_weights=True))
    write(t, "sdpa_bottom_right_dropout", sdpa_case(1, (1, 1, 3, 9, 4, 16, 16), causal=2, dropout=3, scale=2))
    write(t, "sdpa_long", sdpa_case(5, (2, 200, 520, 7, 3), masks=((0, None), (1, (True,))), causal=1, fill=2))
    write(t, "sdpa_long_large_logits", sdpa_case(5, (2, 200, 520, 7, 3), masks=((0, None), (1, (True,))), causal=1,
                                                  fill=2, magnitude=3))
    write(t, "sdpa_logits_1e4_nan", sdpa_case(0, (1, 1, 1, 4, 6, 2, 3), magnitude=4,
                                              specials=((0, 1, 0), (1, 5, 1), (2, 2, 3))))
    write(t, "sdpa_zero_lengths", sdpa_case(0, (1, 2, 1, 0, 5, 4, 4), need_weights=True))
    write(t, "sdpa_damaged", sdpa_case(6, (1, 1, 1, 3, 3, 4, 4), damage=(1, 2, (3, 5))))
    write(t, "sdpa_overflow", sdpa_case(7, (1, 1, 1, 1 << 62, 1 << 62, 0, 0), scale=1))
    write(t, "module_self", module_case(8, 2, 2, 5, 5, attn_kind=1, is_causal=False))
    write(t, "module_cross_kdim_vdim", module_case(6, 3, 1, 4, 7, kdim=5, vdim=3, batch_first=True, padding_kind=1,
                                                   attn_kind=2, attn_2d=False, average=False, add_bias_kv=True))
    write(t, "module_training_zero_attn", module_case(4, 1, 3, 3, 2, dropout=2, training=True, add_zero_attn=True,
                                                      unbatched=True, padding_kind=2, need_weights=False))
    write(t, "module_zero_keys", module_case(4, 2, 2, 3, 0))
    write(t, "module_bad_heads", module_case(6, 4, 1, 2, 2))


# --- wordpiece_tokenizer: an options byte, a max_length byte, then the text --------------------
def wordpiece_tokenizer():
    t = "wordpiece_tokenizer"
    lower_chinese_clean = 1 | 8 | 16
    write(t, "plain", bytes([lower_chinese_clean, 16]) + "ab, ba! é".encode())
    write(t, "special_tokens", bytes([lower_chinese_clean, 40]) + "a[MASK]b [CLS][SEP] [mask]".encode())
    write(t, "cjk_accents_cased", bytes([8 | 16 | 4, 12]) + "东京 É e\u0301 İı ß".encode())
    write(t, "controls_and_spaces", bytes([lower_chinese_clean, 20]) + "a\u200bb\u00adc\x00d\ufffd\u3000\u2028\x1b[2J".encode())
    write(t, "long_word", bytes([lower_chinese_clean, 8]) + b"a" * 150)
    write(t, "invalid_utf8", bytes([lower_chinese_clean, 9]) + b"ab \xff\xc3 \xe2\x82")
    write(t, "max_length_1", bytes([0, 1]) + b"ab")


if __name__ == "__main__":
    safetensors_parse()
    safetensors_roundtrip()
    idx_reader()
    attention_module()
    wordpiece_tokenizer()
