"""Writes a copy of an llm.c token shard whose tokens [START, END) are all
TOKEN: a batch unlike any other, for train.spike_sigma's end-to-end test.

usage: make_spiky_shard.py IN OUT START END TOKEN
"""
import struct
import sys

HEADER_BYTES = 256 * 4  # llm.c's header: 256 int32, the token count third


def main(src, dst, start, end, token):
    with open(src, "rb") as f:
        data = bytearray(f.read())
    count = struct.unpack_from("<i", data, 8)[0]
    if not 0 <= start < end <= count:
        sys.exit(f"make_spiky_shard: [{start}, {end}) is not within the shard's {count} tokens")
    for i in range(start, end):
        struct.pack_into("<H", data, HEADER_BYTES + 2 * i, token)
    with open(dst, "wb") as f:
        f.write(data)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]))
