# Sourced by the *_vs_fio.sh scripts: the disk's own limit for durable
# sequential appends, measured with fio in the same run as the thing compared.
#
# fio_write_limits DIR SIZE BS...
#   Runs fio's O_DIRECT sequential write with an fdatasync after every write at
#   each block size, on a SIZE file in DIR, and fills the associative array FIO
#   (declare -A FIO first): FIO[bs]="MB/s fdatasync_p50_us". Prints one line each.
fio_write_limits() {
  local dir=$1 size=$2 bs
  shift 2
  command -v fio >/dev/null || { echo "fio is not installed: apt-get install fio" >&2; return 2; }
  # Lay the file out first, so the measured runs overwrite allocated blocks,
  # as the broker does with its preallocated segments.
  fio --name=prep --filename="$dir/fio.dat" --size="$size" --bs=1m --rw=write --direct=1 --ioengine=sync \
    >/dev/null 2>&1
  for bs in "$@"; do
    FIO[$bs]=$(fio --name=w --filename="$dir/fio.dat" --size="$size" --bs="$bs" --rw=write --direct=1 \
        --fdatasync=1 --ioengine=sync --output-format=json 2>/dev/null |
      python3 -c 'import json,sys; j=json.load(sys.stdin)["jobs"][0]; w=j["write"]; s=j["sync"]["lat_ns"]
p=s.get("percentile",{}).get("50.000000", s["mean"]); print("%.1f %.0f" % (w["bw_bytes"]/1e6, p/1e3))')
    echo "fio O_DIRECT seq write + fdatasync, bs=$bs: ${FIO[$bs]% *} MB/s (fdatasync p50 ${FIO[$bs]#* } us)"
  done
  rm -f "$dir/fio.dat"
}

# fio_read_limits DIR SIZE BS...
#   The disk's own limit for a sequential catch-up read: lays out a SIZE file
#   in DIR, then runs fio's O_DIRECT sequential read with one request at a time
#   (psync, like a reader awaiting each read) at each block size, and fills
#   the associative array FIO (declare -A FIO first): FIO[bs]="MB/s". Prints
#   one line each and removes the file.
fio_read_limits() {
  local dir=$1 size=$2 bs
  shift 2
  command -v fio >/dev/null || { echo "fio is not installed: apt-get install fio" >&2; return 2; }
  fio --name=prep --filename="$dir/fio.dat" --size="$size" --bs=1m --rw=write --direct=1 --ioengine=psync \
    >/dev/null 2>&1
  for bs in "$@"; do
    FIO[$bs]=$(fio --name=r --filename="$dir/fio.dat" --size="$size" --bs="$bs" --rw=read --direct=1 \
        --ioengine=psync --output-format=json 2>/dev/null |
      python3 -c 'import json,sys; print("%.1f" % (json.load(sys.stdin)["jobs"][0]["read"]["bw_bytes"]/1e6))')
    echo "fio O_DIRECT seq read, bs=$bs: ${FIO[$bs]} MB/s"
  done
  rm -f "$dir/fio.dat"
}
