# Sourced by tests/view.sh and tests/serve.sh: trains a tiny pointer-
# generator with coverage on six made-up articles into $tmp/run (20
# updates, seconds) and decodes its test split with --json.
# Needs $tmp and $run (the psm-run to use).
for i in 1 2 3 4 5 6; do
  printf '%s\n' '{"id": "'$i'", "article": "the cat sat on the mat . the dog ran in the park '$i' . birds sang .", "highlights": "the cat sat .\nthe dog ran in the park '$i' ."}'
done > "$tmp/sum.jsonl"
cat > "$tmp/sum.cfg" <<CFG
task = { plugin = "cnndm"; train = "$tmp/sum.jsonl"; valid = "$tmp/sum.jsonl"; vocab = 12; };
model = { embedding = { dim = 8; tie = true; }; encoder = { plugin = "bilstm"; hidden = 8; };
          decoder = { plugin = "lstm_attn"; coverage = true; }; head = { plugin = "pointer_generator"; cov_loss_wt = 1.0; }; };
train = { batch = 3; steps = 40; eval_every = 20; log_every = 10; optimizer = { name = "adagrad"; lr = 0.15; }; };
eval = { batch = 4; examples = 3; };
decode = { beam = 2; min_len = 2; max_len = 8; };
metrics = ( "rouge", "repetition" );
run = { dir = "$tmp/run"; };
CFG
"$run" "$tmp/sum.cfg" --quiet > "$tmp/train.out" 2>&1 && "$run" "$tmp/sum.cfg" --mode decode --json > "$tmp/decode.out" 2>&1
tiny_rc=$?
