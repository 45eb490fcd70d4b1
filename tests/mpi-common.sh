# tests/mpi-common.sh — sourced by tests/mpi.sh and tests/mpi-hosts.sh
# (after tests/tap.sh; needs $tmp): comparing runs' logged losses, and the
# small pointer-generator both train on several ranks.
check () { if eval "$2"; then ok "$1"; else bad "$1"; fi; }
# "step loss" of every record of SPLIT in run folder $tmp/RUN
records () { grep "\"split\": \"$2\"" "$tmp/$1/log.jsonl" | sed 's/.*"step": \([0-9]*\),.*"loss": \([^,]*\),.*/\1 \2/'; }
# the largest relative difference between two runs' losses (or "differ" if
# their steps do not line up)
maxrel () {
  records "$1" "$3" > "$tmp/a.txt"
  records "$2" "$3" > "$tmp/b.txt"
  paste -d' ' "$tmp/a.txt" "$tmp/b.txt" | awk '
    $1 != $3 || NF != 4 { bad = 1 }
    { d = $2 - $4; if (d < 0) d = -d; r = d / ($2 < 0 ? -$2 : $2); if (r > m) m = r; k++ }
    END { if (bad || k == 0) print "differ"; else printf "%.3g\n", m }'
}
# ok LABEL when runs A and B logged the same SPLIT losses at the same steps
# to a relative 1e-4 (and the shell condition COND, if given, holds)
close_to () {   # A B SPLIT LABEL [COND]
  r=$(maxrel "$1" "$2" "$3")
  check "$4 ($r <= 1e-4)" "${5:+$5 && }"'awk -v r="$r" "BEGIN { exit !(r != \"differ\" && r + 0 <= 1e-4) }"'
}
# rank_killed VICTIM MPID LABEL [COND]: SIGKILLs the rank process VICTIM
# (empty: none was found, a failure) of the job whose mpirun is MPID, and
# checks that the job fails within a minute, not by the tests' timeout,
# (and COND), and that the run folder $tmp/die keeps a checkpoint
rank_killed () {
  [ -n "$1" ] && kill -KILL "$1"
  start=$(date +%s)
  wait "$2"
  rc=$?
  took=$(( $(date +%s) - start ))
  check "$3 (exit $rc after ${took}s)" "[ -n \"$1\" ] && [ $rc -ne 0 ] && [ $rc -ne 124 ] && [ $took -lt 60 ]${4:+ && $4}"
  check "and the run folder keeps a checkpoint to resume" '[ -s "$tmp/die/last.ckpt" ]'
}
# $tmp/s2s.cfg: See et al.'s model in miniature (coverage on), 16 updates
# of batch 8, validation every 5
cat > "$tmp/s2s.cfg" <<CFG
task = { plugin = "cnndm"; vocab = 300; max_src = 40; max_tgt = 12; max_train = 200; };
model = { embedding = { dim = 16; };
          encoder = { plugin = "bilstm"; hidden = 16; };
          decoder = { plugin = "lstm_attn"; hidden = 16; coverage = true; };
          head = { plugin = "pointer_generator"; cov_loss_wt = 1.0; }; };
train = { batch = 8; steps = 16; eval_every = 5; log_every = 1; valid_examples = 24; clip_norm = 2.0;
          optimizer = { name = "adagrad"; lr = 0.15; }; };
eval = { batch = 4; examples = 8; };
decode = { beam = 2; max_len = 12; };
metrics = ( "rouge" );
CFG
