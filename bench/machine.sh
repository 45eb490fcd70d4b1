# bench/machine.sh — sourced by bench/'s scripts: machine_line prints the
# machine a measurement ran on, as every result must say: its cores, CPU
# model, family and model number, and the vector extensions that choose
# psm's kernels (AMX tiles, AVX-512, AVX2). Figures from different
# machines are not comparable.
machine_line () {
  cpu_field () { grep -m1 "^$1[[:space:]]*:" /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'; }
  isa=$(grep -o -m1 -w -E 'amx_tile|avx512f|avx2' /proc/cpuinfo | sort -u | tr '\n' ' ' | sed 's/ $//')
  echo "# machine: $(nproc --all) cores, $(cpu_field 'model name'), CPU family $(cpu_field 'cpu family')" \
    "model $(cpu_field model), ${isa:-no avx2}"
}
