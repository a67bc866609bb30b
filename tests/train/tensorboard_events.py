"""Reads a run's TensorBoard event files with a decoder of its own (TFRecord
frames, their masked CRC-32C computed bit by bit, Event/Summary messages)
and checks them against the run's metrics.jsonl: every step's loss,
learning rate, gradient norm, parameter norm (log.param_norm) and
gradient and parameter norms by group (log.grad_norms, log.param_norms),
the validation losses, and the samples
(eval.samples) as text summaries of TensorBoard's text plugin.

    python3 tensorboard_events.py OUTPUT_DIR STEPS [SAMPLES]
"""
import glob
import json
import math
import struct
import sys


def crc32c(data):
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def masked(data):
    c = crc32c(data)
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def fields(buf):
    """(field number, value) of a protocol buffer message."""
    at = 0
    while at < len(buf):
        key, at = varint(buf, at)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, at = varint(buf, at)
        elif wire == 1:
            value, at = buf[at:at + 8], at + 8
        elif wire == 5:
            value, at = buf[at:at + 4], at + 4
        elif wire == 2:
            n, at = varint(buf, at)
            value, at = buf[at:at + n], at + n
        else:
            raise ValueError("wire type %d" % wire)
        yield number, value


def varint(buf, at):
    shift = result = 0
    while True:
        b = buf[at]
        at += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, at
        shift += 7


def events(path):
    data = open(path, "rb").read()
    at = 0
    while at < len(data):
        header = data[at:at + 8]
        (n,) = struct.unpack("<Q", header)
        (header_crc,) = struct.unpack("<I", data[at + 8:at + 12])
        body = data[at + 12:at + 12 + n]
        (body_crc,) = struct.unpack("<I", data[at + 12 + n:at + 16 + n])
        assert header_crc == masked(header), "bad length checksum at %d" % at
        assert body_crc == masked(body), "bad data checksum at %d" % at
        at += 16 + n
        yield dict(fields(body))


def main():
    out, steps = sys.argv[1], int(sys.argv[2])
    files = glob.glob(out + "/events.out.tfevents.*")
    assert len(files) == 1, files
    scalars = {}
    texts = {}
    version = None
    for event in events(files[0]):
        if 3 in event:
            version = event[3].decode()
        if 5 not in event:
            continue
        step = event.get(2, 0)
        for number, value in fields(event[5]):
            assert number == 1
            v = dict(fields(value))
            if 2 in v:
                (f,) = struct.unpack("<f", v[2])
                scalars[(v[1].decode(), step)] = f
                continue
            # A text summary: the text plugin's metadata, a scalar string tensor.
            plugin = dict(fields(dict(fields(v[9]))[1]))
            assert plugin[1] == b"text", plugin
            tensor = dict(fields(v[8]))
            assert tensor[1] == 7 and tensor[2] == b"", tensor
            texts[(v[1].decode(), step)] = tensor[8].decode("utf-8", "replace")
    assert version == "brain.Event:2", version
    metrics = [json.loads(line) for line in open(out + "/metrics.jsonl")]
    assert len(metrics) == steps, len(metrics)
    vals = norms = decays = 0
    for m in metrics:
        for key, tag in (("loss", "train/loss"), ("lr", "train/lr"),
                         ("weight_decay", "train/weight_decay"),
                         ("grad_norm", "train/grad_norm"), ("param_norm", "train/param_norm"),
                         ("val_loss", "val/loss")):
            if key not in m:
                assert (tag, m["step"]) not in scalars, (tag, m["step"])
                continue
            got = scalars[(tag, m["step"])]
            assert math.isclose(got, m[key], rel_tol=1e-6), (tag, m["step"], got, m[key])
            vals += key == "val_loss"
            norms += key == "param_norm"
            decays += key == "weight_decay"
    assert vals >= 2, "expected validation losses, found %d" % vals
    # (train.weight_decay_schedule: the run's decay changes at every step.)
    assert decays == steps, "expected %d weight decays, found %d" % (steps, decays)
    assert norms == steps, "expected %d parameter norms (log.param_norm), found %d" % (steps, norms)
    # log.grad_norms, log.param_norms: every group's norm as grad_norm/<group>
    # and param_norm/<group>, and no other.
    groups = 0
    for key, prefix in (("grad_norms", "grad_norm/"), ("param_norms", "param_norm/")):
        found = 0
        for m in metrics:
            for name, norm in m.get(key, {}).items():
                got = scalars.pop((prefix + name, m["step"]))
                assert math.isclose(got, norm, rel_tol=1e-6), (name, m["step"], got, norm)
                found += 1
        stray = [k for k in scalars if k[0].startswith(prefix)]
        assert not stray, "%s scalars without %s in metrics.jsonl: %s" % (prefix, key, stray)
        assert found >= steps, "expected %s by group, found %d" % (key, found)
        groups += found
    samples = 0
    for m in metrics:
        for i, s in enumerate(m.get("samples", [])):
            tag = "samples/%d" % (i + 1)
            want = "```\n" + s["prompt"] + s["text"] + "\n```"
            assert texts.pop((tag, m["step"])) == want, (tag, m["step"])
            samples += 1
    assert not texts, "texts without samples in metrics.jsonl: %s" % list(texts)
    expected = int(sys.argv[3]) if len(sys.argv) > 3 else 0
    assert samples == expected, "expected %d samples, found %d" % (expected, samples)
    print("tensorboard events match metrics.jsonl: %d steps, %d validation losses, %d samples, "
          "%d norms by group" % (len(metrics), vals, samples, groups))


main()
