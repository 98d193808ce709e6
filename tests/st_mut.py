# tests/st_mut.py SRC DST WHAT [ARG] - a safetensors file SRC with one
# thing changed, written to DST (tests/int8_crc.sh, tests/export_crc.sh;
# `old` for the tests that then change the values of a kiln export):
#   flip TENSOR     a bit of TENSOR's 6th byte (its last where it is shorter)
#   header          a bit of the INT8 model's config text (kiln.config)
#   input           the INT8 model's fc1 input told s8 (it is u8)
#   meta KEY        the first character of metadata KEY's value changed
#   crcs            kiln.crc32c holding one CRC less
#   old             kiln.crc32c removed (a file of a kiln before it)
#   oldflip TENSOR  both
#   tensors         (DST unused) print the tensor names in byte order; exit
#                   1 unless kiln.crc32c holds 1 + one CRC32C a tensor
# (tests/st.py reads and writes the file; tests/lib.sh puts it on PYTHONPATH)
import re, sys
import st
src, dst, what = sys.argv[1:4]
arg = sys.argv[4] if len(sys.argv) > 4 else None
if what == "tensors":
    f = st.load(src)
    t = sorted(f.header)
    ok = re.fullmatch("[0-9a-f]{8}( [0-9a-f]{8}){%d}" % len(t), f.meta.get("kiln.crc32c", ""))
    print(" ".join(t))
    sys.exit(0 if ok else 1)
def edit(h, m, data):
    def flip(name):
        a, e = h[name]["data_offsets"]
        data[min(a + 5, e - 1)] ^= 0x01
    if what == "flip":
        flip(arg)
    elif what == "header":
        m["kiln.config"] = m["kiln.config"].replace("[layer.", "[layer/", 1)
    elif what == "input":
        assert m["fc1.input"] == "u8"
        m["fc1.input"] = "s8"
    elif what == "meta":
        v = m[arg]
        m[arg] = ("1" if v[0] != "1" else "2") + v[1:]
    elif what == "crcs":
        m["kiln.crc32c"] = m["kiln.crc32c"].rsplit(" ", 1)[0]
    elif what in ("old", "oldflip"):
        del m["kiln.crc32c"]
        if what == "oldflip":
            flip(arg)
    else:
        sys.exit("st_mut.py: no such change: " + what)
st.rewrite(src, dst, edit)
