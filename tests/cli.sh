#!/bin/sh
# psm-run as a user meets it: exit codes, messages naming file/line/key,
# run folders never overwritten, same seed -> same losses, --resume exact,
# NaN guard, corrupt checkpoint, decode output, --list.
set -u
run="$top_builddir/tools/psm-run"
fixtures="$top_builddir/tests/.libs"
tmp=$(mktemp -d "${TMPDIR:-/tmp}/psm-cli-XXXXXX")
trap 'rm -rf "$tmp"' EXIT
. "$top_srcdir/tests/tap.sh"

cat > "$tmp/tiny.cfg" <<CFG
task = { plugin = "rarest_word"; vocab = 40; length = 5; pointer_words = 5;
         geometric_p = 0.02; valid_size = 40; test_size = 60; };
model = { embedding = { dim = 8; };
          encoder = { plugin = "gru"; hidden = 16; };
          head = { plugin = "pointer_softmax"; location = "summary"; hidden = 16; attn_dim = 8; switch_hidden = 8; }; };
train = { batch = 16; steps = 30; eval_every = 10; log_every = 5;
          optimizer = { name = "adam"; lr = 0.01; }; };
eval = { batch = 25; };
metrics = ( "error_rate" );
CFG

expect 0 "--help" "--resume" -- "$run" --help
abi=$(sed -n 's/^#define PSM_ABI_MAJOR \([0-9]*\)$/\1/p' "$top_srcdir/core/psm/psm-plugin.h").$(sed -n 's/^#define PSM_ABI_MINOR \([0-9]*\)$/\1/p' "$top_srcdir/core/psm/psm-plugin.h")
expect 0 "--version" "plugin ABI $abi" -- "$run" --version
expect 0 "--describe a head: its hooks" "gate           optional  set" -- "$run" --describe pointer_generator
grep -q "cov_loss_wt" "$tmp/out" && grep -q "ABI          $abi" "$tmp/out" && grep -q "configured   model.head" "$tmp/out" \
  && ok "--describe shows ABI, section, every parameter" || bad "--describe shows ABI, section, every parameter"
expect 0 "--describe KIND/NAME" "kind         metric" -- "$run" --describe metric/rouge
expect 0 "--describe a plugin file" "Plugin softmax" -- "$run" --describe "$top_builddir/plugins/.libs/psm-head-softmax.so"
expect 0 "--describe a core section" "Core section train.optimizer" -- "$run" --describe train.optimizer
expect 2 "--describe an unknown name" "no plugin or core section of that name" -- "$run" --describe no_such_thing
expect 2 "--describe a bad kind" "'model' is not a plugin kind" -- "$run" --describe model/softmax
expect 2 "--describe a broken plugin file" "not a psm plugin" -- "$run" --describe "$fixtures/psm-metric-noentry.so"
expect 0 "--list shows plugins and their parameters" "temperature" -- "$run" --list
grep -q "rarest_word" "$tmp/out" && grep -q "train.optimizer" "$tmp/out" && ok "--list shows tasks and core sections" || bad "--list shows tasks and core sections"
missing=""
for name in $(awk '/^      [a-z_0-9]+ +(int|float|bool|string|choice|file) /{print $1}' "$tmp/out" | sort -u); do
  grep -q -w -- "$name" "$top_srcdir/doc/psm-pipeline.5" || missing="$missing $name"
done
[ -z "$missing" ] && ok "psm-pipeline(5) documents every declared parameter" || { echo "    undocumented:$missing"; bad "psm-pipeline(5) documents every declared parameter"; }
expect 2 "no pipeline: usage error" "expected one pipeline file" -- "$run"
expect 2 "bad option value" "expected all, train, eval or decode" -- "$run" --mode fly "$tmp/tiny.cfg"
expect 2 "missing pipeline file" "nope.cfg: cannot read pipeline: no such file" -- "$run" "$tmp/nope.cfg"
sed 's/length = 5;/length = 0; lenght = 5;/' "$tmp/tiny.cfg" > "$tmp/bad.cfg"
expect 2 "config errors name file, line and key" "bad.cfg:1: task.length: value 0 out of range" -- "$run" "$tmp/bad.cfg"
grep -q "bad.cfg:1: task.lenght: unknown key" "$tmp/out" && ok "all config errors reported at once" || bad "all config errors reported at once"
expect 2 "--set swaps to an unknown head" "--set model.head.plugin: no head plugin named 'nosuch'" -- "$run" --check "$tmp/tiny.cfg" --set model.head.plugin=nosuch
expect 0 "--set swaps the head for an ablation" "check: OK" -- "$run" --check "$tmp/tiny.cfg" --set model.head.plugin=softmax
grep -q "tiny.cfg:5: model.head.switch_hidden: ignored: not a parameter of head 'softmax' (set by --set)" "$tmp/out" && ok "the swapped head's foreign keys are dropped with a note" || bad "foreign keys noted"
expect 2 "keys given by --set are still validated after a swap" "--set model.head.temperature: unknown key" -- \
  "$run" --check "$tmp/tiny.cfg" --set model.head.plugin=softmax --set model.head.temperature=3

# training, determinism, no overwrite
expect 0 "train + test" "test (.*best.ckpt) step" -- "$run" "$tmp/tiny.cfg" --set "run.dir=$tmp/a"
for f in last.ckpt best.ckpt log.jsonl pipeline.cfg; do [ -s "$tmp/a/$f" ] || bad "run folder holds $f"; done
grep -q '"split": "valid".*"error_rate"' "$tmp/a/log.jsonl" && grep -q '"split": "test"' "$tmp/a/log.jsonl" && ok "JSON log has train, valid and test records" || bad "JSON log records"
sum=$(cksum < "$tmp/a/last.ckpt")
expect 2 "a second run never overwrites a run folder" "already holds a run" -- "$run" "$tmp/tiny.cfg" --set "run.dir=$tmp/a"
[ "$(cksum < "$tmp/a/last.ckpt")" = "$sum" ] && ok "checkpoint untouched" || bad "checkpoint untouched"
expect 0 "same seed, second run" "trained 30 steps" -- "$run" --mode train "$tmp/tiny.cfg" --set "run.dir=$tmp/b"
losses () { grep '"split": "train"' "$1" | sed 's/.*"loss": \([^,]*\),.*/\1/'; }
[ -n "$(losses "$tmp/a/log.jsonl")" ] && [ "$(losses "$tmp/a/log.jsonl")" = "$(losses "$tmp/b/log.jsonl")" ] && ok "same seed gives the same losses" || bad "same seed gives the same losses"
expect 0 "another seed" "trained 30 steps" -- "$run" --mode train "$tmp/tiny.cfg" --set "run.dir=$tmp/c" --set train.seed=2
[ "$(losses "$tmp/a/log.jsonl")" != "$(losses "$tmp/c/log.jsonl")" ] && ok "another seed gives other losses" || bad "another seed gives other losses"
# an evaluation keeps the weights packed over its batches (psm_graph_packed):
# training after it must pack the updated ones again
expect 0 "no evaluation between updates" "trained 30 steps" -- "$run" --mode train "$tmp/tiny.cfg" --set "run.dir=$tmp/ne" \
  --set train.eval_every=1000
[ "$(losses "$tmp/b/log.jsonl")" = "$(losses "$tmp/ne/log.jsonl")" ] && ok "evaluations between updates leave the training losses as they were" ||
  bad "evaluations between updates leave the training losses as they were"

# resume: 20 steps then 10 more == 30 straight
expect 0 "train 20 steps" "trained 20 steps" -- "$run" --mode train "$tmp/tiny.cfg" --set "run.dir=$tmp/r" --set train.steps=20
expect 0 "--resume to 30" "resumed .* at step 20" -- "$run" --mode train --resume "$tmp/tiny.cfg" --set "run.dir=$tmp/r"
cmp -s "$tmp/b/last.ckpt" "$tmp/r/last.ckpt" && ok "resumed run ends bit-identical to the straight run" || bad "resumed run ends bit-identical"
expect 2 "--resume without a run" "nothing to resume" -- "$run" --resume "$tmp/tiny.cfg" --set "run.dir=$tmp/none"
expect 0 "--resume past train.steps says there is nothing to train" "nothing to train: .*last.ckpt is at step 30 and train.steps is 1" -- \
  "$run" --mode train --resume "$tmp/tiny.cfg" --set "run.dir=$tmp/r" --set train.steps=1
cmp -s "$tmp/b/last.ckpt" "$tmp/r/last.ckpt" && ok "and leaves the run as it was" || bad "and leaves the run as it was"
expect 1 "--resume under another optimiser is refused" "trained with optimiser 'adam', the pipeline asks for 'sgd'" -- \
  "$run" --mode train --resume "$tmp/tiny.cfg" --set "run.dir=$tmp/r" --set train.steps=40 --set train.optimizer.name=sgd
expect 1 "--resume with another learning rate is refused" "trained with adam lr = 0.01, the pipeline asks for 0.02" -- \
  "$run" --mode train --resume "$tmp/tiny.cfg" --set "run.dir=$tmp/r" --set train.steps=40 --set train.optimizer.lr=0.02
expect 2 "train.steps = 0 is refused up front" "train.steps: value 0 out of range" -- \
  "$run" "$tmp/tiny.cfg" --set "run.dir=$tmp/zero" --set train.steps=0
[ ! -e "$tmp/zero" ] && ok "and no run folder is made" || bad "and no run folder is made"

# sizes inside the declared ranges that do not fit: clear errors before anything is allocated
expect 2 "a model too big for the memory is a config error" "the model is too big for this machine: .* (largest: encoder.w_x, 16384 x 49152)" -- \
  env PSM_MEMORY_LIMIT=8G "$run" "$tmp/tiny.cfg" --set "run.dir=$tmp/big" --set model.embedding.dim=16384 --set model.encoder.hidden=16384
[ ! -e "$tmp/big" ] && ok "and no run folder is made" || bad "and no run folder is made"
expect 2 "the widest sizes are out of range" "model.embedding.dim: value 65536 out of range (expected \[1, 16384\])" -- \
  "$run" --check "$tmp/tiny.cfg" --set model.embedding.dim=65536 --set model.encoder.hidden=65536
expect 2 "a step too big for the memory is a config error" "one training step needs at least 107.3 GiB (train.batch 60000" -- \
  env PSM_MEMORY_LIMIT=1G "$run" --check "$tmp/tiny.cfg" --set task.length=10000 --set train.batch=60000
expect 2 "evaluation sets too big for the memory" "task.valid_size: 10000000 sequences of 10000 words need 372.5 GiB" -- \
  env PSM_MEMORY_LIMIT=8G "$run" --mode train "$tmp/tiny.cfg" --set "run.dir=$tmp/big" --set task.length=10000 --set task.valid_size=10000000
if [ -n "${PSM_TEST_SANITIZED:-}" ]; then
  echo "ok - # SKIP out-of-memory in a step: ulimit -v and AddressSanitizer's shadow memory exclude each other"
else
  # the bound above lets this through (its activations are 4x the bound): the arena runs out mid-step
  out=$( (ulimit -v 3000000; exec "$run" --mode train "$tmp/tiny.cfg" --set "run.dir=$tmp/oom" --set task.length=1000 \
          --set train.batch=6000 --set train.steps=2 2>&1); echo "exit $?")
  printf '%s\n' "$out" > "$tmp/out"
  grep -q "^exit 1$" "$tmp/out" && grep -q "psm-run: out of memory: cannot allocate .* for a block of a step's tensors" "$tmp/out" \
    && ok "running out of memory mid-step is exit 1 with a message, not an abort" || bad "running out of memory mid-step is exit 1 with a message"
fi

# write errors stop the run with exit 1 and leave nothing half-written
# (no file may grow: output through a pipe; SIGXFSZ ignored so writes fail with EFBIG)
out=$( (ulimit -f 0; trap '' XFSZ; exec "$run" --mode train "$tmp/tiny.cfg" --set "run.dir=$tmp/full" 2>&1); echo "exit $?")
printf '%s\n' "$out" > "$tmp/out"
grep -q "^exit 1$" "$tmp/out" && grep -q "pipeline.cfg: cannot write the resolved pipeline: File too large" "$tmp/out" && ok "a pipeline.cfg that cannot be written stops the run" || bad "a pipeline.cfg that cannot be written stops the run"
[ ! -e "$tmp/full/pipeline.cfg" ] && ok "and no empty pipeline.cfg is renamed into place" || bad "and no empty pipeline.cfg is renamed into place"
# a symbolic link planted in a run folder is not written through (issue 58)
cp -r "$tmp/r" "$tmp/logfull"
echo "the victim's words" > "$tmp/victim.txt"
rm "$tmp/logfull/log.jsonl" && ln -s "$tmp/victim.txt" "$tmp/logfull/log.jsonl"
expect 1 "a log.jsonl that is a symbolic link stops training, named" \
  "log.jsonl: cannot open log: is a symbolic link (psm does not write through links in a run folder)" -- \
  "$run" --mode train --resume "$tmp/tiny.cfg" --set "run.dir=$tmp/logfull" --set train.steps=40
[ "$(cat "$tmp/victim.txt")" = "the victim's words" ] && ok "and the link's target is untouched" || bad "the victim was written"
rm "$tmp/logfull/log.jsonl" && cp "$tmp/r/log.jsonl" "$tmp/logfull/log.jsonl"
# outputs go to NAME.part, renamed over NAME once the whole decoding succeeded
echo "earlier summaries" > "$tmp/logfull/decode.test.txt"
ln -s "$tmp/victim.txt" "$tmp/logfull/decode.test.txt.part"
expect 1 "a decode output that is a symbolic link is an error" "decode.test.txt.part: cannot write: is a symbolic link" -- \
  "$run" --mode decode "$tmp/tiny.cfg" --set "run.dir=$tmp/logfull"
[ "$(cat "$tmp/logfull/decode.test.txt")" = "earlier summaries" ] && [ "$(cat "$tmp/victim.txt")" = "the victim's words" ] &&
  ok "and the earlier outputs and the link's target are kept" || bad "a failed decoding kept the earlier outputs"
rm -f "$tmp/logfull/decode.test.txt.part"
# checkpoints are written to an unpredictable temporary name: a link planted
# at the old predictable one (NAME.tmp.PID) is never followed
ln -s "$tmp/victim.txt" "$tmp/logfull/last.ckpt.tmp.1"
expect 0 "training past a planted last.ckpt.tmp link" "resumed" -- \
  "$run" --mode train --resume "$tmp/tiny.cfg" --set "run.dir=$tmp/logfull" --set train.steps=40
[ "$(cat "$tmp/victim.txt")" = "the victim's words" ] && ok "and the link's target is untouched" || bad "the victim was written"

# corrupt checkpoint
cp -r "$tmp/r" "$tmp/corrupt"
printf 'X' | dd of="$tmp/corrupt/last.ckpt" bs=1 seek=200 conv=notrunc 2>/dev/null
expect 1 "corrupt checkpoint is refused" "checksum mismatch" -- "$run" --mode train --resume "$tmp/tiny.cfg" --set "run.dir=$tmp/corrupt" --set train.steps=40

expect 2 "eval without a run is a usage error" "no checkpoint to evaluate" -- "$run" --mode eval "$tmp/tiny.cfg" --set "run.dir=$tmp/none"
# eval and decode from the best checkpoint
expect 0 "eval on valid" "valid (.*best.ckpt)" -- "$run" --mode eval --split valid "$tmp/tiny.cfg" --set "run.dir=$tmp/a"
expect 0 "decode writes outputs" "decodes written to" -- "$run" --mode decode "$tmp/tiny.cfg" --set "run.dir=$tmp/a"
[ "$(wc -l < "$tmp/a/decode.test.txt")" -eq 60 ] && grep -q '^w[0-9]*	w[0-9]*$' "$tmp/a/decode.test.txt" && ok "one decode line per test example" || bad "decode lines"

# NaN loss: stop, name the step, keep the last good checkpoint
export PSM_PLUGIN_PATH="$PSM_PLUGIN_PATH:$fixtures"
expect 1 "NaN loss stops training and names the step" "step 26: training loss is NaN (first non-finite gradient: embedding.src (7 of 7 parameters)); training stopped" -- \
  "$run" --mode train "$tmp/tiny.cfg" --set "run.dir=$tmp/nan" --set model.head.plugin=nan --set model.head.nan_after=25
[ -s "$tmp/nan/last.ckpt" ] && ok "the last good checkpoint is there" || bad "the last good checkpoint is there"
expect 0 "and training resumes from it (step 20, before the NaN)" "resumed .*last.ckpt at step 20" -- \
  "$run" --mode train --resume "$tmp/tiny.cfg" --set "run.dir=$tmp/nan" --set model.head.plugin=nan --set model.head.nan_after=100
expect 1 "NaN before the first validation keeps the step-0 checkpoint" "step 4: training loss is NaN .*The last good checkpoint (.*nan0/last.ckpt) is intact" -- \
  "$run" --mode train "$tmp/tiny.cfg" --set "run.dir=$tmp/nan0" --set model.head.plugin=nan --set model.head.nan_after=3
expect 0 "which resumes at step 0" "resumed .*last.ckpt at step 0" -- \
  "$run" --mode train --resume "$tmp/tiny.cfg" --set "run.dir=$tmp/nan0" --set model.head.plugin=nan --set model.head.nan_after=100
# train.on_nonfinite: skip the update, or roll back, a bounded number of times
expect 0 "on_nonfinite = skip skips the update and goes on" "step 13: training loss is NaN (first non-finite gradient: embedding.src .*); update skipped (1 of at most 5)" -- \
  "$run" --mode train "$tmp/tiny.cfg" --set "run.dir=$tmp/skip" --set model.head.plugin=nan --set model.head.nan_after=12 \
  --set model.head.nan_count=2 --set train.on_nonfinite=skip
grep -q "update skipped (2 of at most 5)" "$tmp/out" && grep -q "trained 30 steps" "$tmp/out" && ok "both skipped, training ends" || bad "both skipped, training ends"
[ "$(grep -c '"event": "nonfinite".*"action": "skip"' "$tmp/skip/log.jsonl")" -eq 2 ] && grep -q '"step": 13, "event": "nonfinite", "what": "loss", "value": "NaN", "first_param": "embedding.src"' "$tmp/skip/log.jsonl" \
  && ok "each skip is a log record with the step and the first parameter" || bad "each skip is a log record"
expect 1 "more skips than train.nonfinite_max stop training" "step 15: training loss is NaN .*: 3 non-finite steps, more than train.nonfinite_max = 2 allows; training stopped" -- \
  "$run" --mode train "$tmp/tiny.cfg" --set "run.dir=$tmp/skipmax" --set model.head.plugin=nan --set model.head.nan_after=12 \
  --set train.on_nonfinite=skip --set train.nonfinite_max=2
expect 0 "on_nonfinite = rollback goes back to the last checkpoint with half the learning rate" "back at step 10 from .*rb/last.ckpt, learning rate now 0.005" -- \
  "$run" --mode train "$tmp/tiny.cfg" --set "run.dir=$tmp/rb" --set model.head.plugin=nan --set model.head.nan_after=13 \
  --set model.head.nan_count=1 --set train.on_nonfinite=rollback
grep -q "step 14: training loss is NaN .*; rolled back (1 of at most 5)" "$tmp/out" && grep -q "trained 30 steps" "$tmp/out" && ok "and trains to the end" || bad "rollback trains to the end"
grep -q '"step": 14, "event": "nonfinite", "what": "loss", "value": "NaN", "first_param": "embedding.src", "params": 7, "action": "rollback", "lr": 0.005' "$tmp/rb/log.jsonl" \
  && ok "the rollback is a log record" || bad "the rollback is a log record"
expect 1 "rollbacks are bounded too" "2 non-finite steps, more than train.nonfinite_max = 1 allows" -- \
  "$run" --mode train "$tmp/tiny.cfg" --set "run.dir=$tmp/rbmax" --set model.head.plugin=nan --set model.head.nan_after=13 \
  --set train.on_nonfinite=rollback --set train.nonfinite_max=1
expect 1 "--list names broken plugins on the path" "not a psm plugin" -- "$run" --list

# a task's bad batches are caught by the core, naming the task plugin
cat > "$tmp/bad.cfg" <<CFG
task = { plugin = "bad"; };
model = { embedding = { dim = 4; }; encoder = { plugin = "gru"; hidden = 8; };
          head = { plugin = "softmax"; }; };
train = { batch = 4; steps = 5; eval_every = 5; optimizer = { lr = 0.05; }; };
metrics = ( "error_rate" );
CFG
expect 0 "the fixture task without defects passes --check" "check: OK" -- "$run" --check "$tmp/bad.cfg"
for d in "src_id:src\[step 2, example 3\] = 10 is outside the source vocabulary \[0, 10)" \
         "tgt_id:tgt\[step 0, example 3\] = 12 is outside the target shortlist \[0, 10)" \
         "long_src:source length 5 (the task declared max_src_len 4)" \
         "src_mask:src_mask\[step 1, example 3\] = 0.5 (expected 0 or 1)" \
         "loc_padding:tgt_loc\[step 0, example 3\] = 3 points at padding" \
         "too_many:5 examples (asked for at most 4)"; do
  expect 1 "bad batch (${d%%:*}) is an error naming the task" "task plugin 'bad' returned a bad batch: ${d#*:}" -- \
    "$run" --check "$tmp/bad.cfg" --set task.defect="${d%%:*}"
done
expect 1 "bad evaluation batch is an error too" "task plugin 'bad' returned a bad batch: src\[step 2, example 19\] = 10" -- \
  "$run" --check "$tmp/bad.cfg" --set task.defect=src_id --set task.where=eval
expect 1 "a task that describes itself wrongly" "task plugin 'bad' describes itself wrongly: tgt_vocab < 1" -- \
  "$run" --check "$tmp/bad.cfg" --set task.defect=info
# and the batches of raw text (decoding --input, serve) are checked too
cat > "$tmp/badtext.cfg" <<CFG
task = { plugin = "bad"; where = "text"; };
model = { embedding = { dim = 4; }; encoder = { plugin = "bigru"; hidden = 4; }; decoder = { plugin = "gru_attn"; };
          head = { plugin = "softmax"; }; };
train = { batch = 4; steps = 2; eval_every = 2; optimizer = { lr = 0.05; }; };
decode = { beam = 1; min_len = 0; max_len = 2; };
metrics = ( "error_rate" );
CFG
printf 'a b c\n' > "$tmp/abc.txt"
expect 0 "the fixture task as a sequence-to-sequence one trains" "trained 2 steps" -- \
  "$run" --mode train "$tmp/badtext.cfg" --set "run.dir=$tmp/badtext"
expect 0 "its raw-text batch without defects decodes" "decoded 1 text" -- \
  "$run" --mode decode --input "$tmp/abc.txt" "$tmp/badtext.cfg" --set "run.dir=$tmp/badtext"
for d in "src_id:src\[step 2, example 0\] = 10 is outside the source vocabulary \[0, 10)" \
         "too_many:2 examples (asked for at most 1)"; do
  expect 1 "bad raw-text batch (${d%%:*}) is an error naming the task" "task plugin 'bad' returned a bad batch: ${d#*:}" -- \
    "$run" --mode decode --input "$tmp/abc.txt" "$tmp/badtext.cfg" --set "run.dir=$tmp/badtext" --set task.defect="${d%%:*}"
done
expect 1 "a metric reporting too many values is an error" "metric plugin 'toomany' reported 17 values (a report holds 0 to 16 named values)" -- \
  "$run" --check "$tmp/bad.cfg" --set metrics=error_rate,toomany

# a second training phase (continue.*): phase one kept, resumable in phase two
expect 0 "two phases in one invocation" "second phase (continue.set): 10 more steps" -- \
  "$run" --mode train "$tmp/tiny.cfg" --set "run.dir=$tmp/ph" --set continue.steps=10 --set continue.set=model.head.temperature=3
[ -f "$tmp/ph/phase1.ckpt" ] && [ -f "$tmp/ph/phase1.best.ckpt" ] && [ -f "$tmp/ph/best.ckpt" ] \
  && grep -q '"step": 40, "split": "valid"' "$tmp/ph/log.jsonl" \
  && ok "phase one's checkpoints are kept; phase two logs steps 31-40" || bad "phase one's checkpoints are kept"
grep -Eq '^phase 1/2  step [0-9]+/30  loss [0-9.]+  [0-9.]+ upd/s  [0-9]+ src\+tgt tok/s  ETA ' "$tmp/out" \
  && grep -Eq '^phase 2/2  step 40/40  loss ' "$tmp/out" && grep -q '"updates_per_s": ' "$tmp/ph/log.jsonl" \
  && ok "the progress line names the phase, updates/s and which tokens" || bad "the progress line names the phase, updates/s and which tokens"
expect 0 "--resume after both phases: nothing left" "is at step 40 and train.steps is 40" -- \
  "$run" --mode train --resume "$tmp/tiny.cfg" --set "run.dir=$tmp/ph" --set continue.steps=10 --set continue.set=model.head.temperature=3
expect 0 "--resume in phase two goes on there" "resumed .*last.ckpt at step 40" -- \
  "$run" --mode train --resume "$tmp/tiny.cfg" --set "run.dir=$tmp/ph" --set continue.steps=20 --set continue.set=model.head.temperature=3
expect 0 "--check checks both phases" "check: the second phase" -- \
  "$run" --check "$tmp/tiny.cfg" --set continue.steps=5 --set continue.set=model.head.temperature=3
cat > "$tmp/cont.cfg" <<CFG
@include "tiny.cfg"
continue = { steps = 5;
  set = [ "model.head.nosuch=1" ]; };
CFG
expect 2 "a bad continue.set names the file and line" "cont.cfg:3: continue.set: the second phase's pipeline is invalid" -- \
  "$run" --check "$tmp/cont.cfg"
expect 2 "continue.set entries are assignments" "continue.set.\[0\]: expected a \"key.path=value\" string" -- \
  "$run" --check "$tmp/tiny.cfg" --set continue.steps=5 --set continue.set=nonsense

# a summariser end to end on a few records: train, test with ROUGE, decode raw text
for i in 1 2 3 4 5 6; do
  printf '%s\n' '{"id": "'$i'", "article": "the cat sat on the mat . the dog ran in the park '$i' . birds sang .", "highlights": "the cat sat .\nthe dog ran ."}'
done > "$tmp/sum.jsonl"
cat > "$tmp/sum.cfg" <<CFG
task = { plugin = "cnndm"; train = "$tmp/sum.jsonl"; valid = "$tmp/sum.jsonl"; vocab = 12; };
model = { embedding = { dim = 6; tie = true; }; encoder = { plugin = "bilstm"; hidden = 5; };
          decoder = { plugin = "lstm_attn"; coverage = true; }; head = { plugin = "pointer_generator"; cov_loss_wt = 1.0; }; };
train = { batch = 3; steps = 20; eval_every = 10; log_every = 10; optimizer = { name = "adagrad"; lr = 0.15; }; };
eval = { batch = 4; examples = 3; };
decode = { beam = 2; min_len = 2; max_len = 8; };
metrics = ( "rouge", "repetition", "novel_ngrams" );
CFG
expect 0 "a summariser trains and tests: ROUGE and two examples" "example 2" -- "$run" "$tmp/sum.cfg" --set "run.dir=$tmp/sum"
grep -q "rouge1_f" "$tmp/out" && grep -q "(3 examples)" "$tmp/out" && [ "$(wc -l < "$tmp/sum/decode.test.txt")" -eq 3 ] \
  && grep -q "the cat sat . <q> the dog ran ." "$tmp/sum/reference.test.txt" \
  && ok "eval.examples = 3 summaries written; references with <q> between sentences" || bad "3 summaries written"
expect 0 "--profile: a table of time per phase after training, the first update left out" "profile over 19 steps" -- \
  "$run" "$tmp/sum.cfg" --mode train --profile --set "run.dir=$tmp/prof"
grep -q "^  decoder .*(all)" "$tmp/out" && grep -q "^  optimiser" "$tmp/out" && ok "--profile: decoder and optimiser rows" \
  || bad "--profile rows"
printf 'The Cat sat on the mat.\n\nA dog!\n' > "$tmp/raw.txt"
expect 0 "decode raw text, one summary a line" "decoded 3 texts" -- "$run" --mode decode --input "$tmp/raw.txt" "$tmp/sum.cfg" --set "run.dir=$tmp/sum"
[ "$(grep -c -v '^psm-run' "$tmp/out")" -eq 3 ] && ok "three lines in, three summaries out" || bad "three summaries out"
grep -v '^psm-run' "$tmp/out" > "$tmp/raw_sum.txt"
# raw text reads no data split: a validation file that is not jsonl is not
# opened (evaluation reads it, and its error names it)
expect 0 "decode raw text reads no split" "decoded 3 texts" -- "$run" --mode decode --input "$tmp/raw.txt" "$tmp/sum.cfg" \
  --set "run.dir=$tmp/sum" --set "task.valid=$tmp/raw.txt"
grep -v '^psm-run' "$tmp/out" | cmp -s - "$tmp/raw_sum.txt" && ok "the same summaries without the splits" \
  || bad "the same summaries without the splits"
expect 1 "evaluation still reads the validation split" "task.valid: .*raw.txt" -- "$run" --mode eval "$tmp/sum.cfg" \
  --set "run.dir=$tmp/sum" --set "task.valid=$tmp/raw.txt"
# a run folder without its vocabulary: built again from the training
# split, with a note saying so
cp -r "$tmp/sum" "$tmp/sum_novocab" && rm "$tmp/sum_novocab/vocab.txt"
expect 0 "decoding without the saved vocabulary says it is built again" "vocab.txt is missing: the vocabulary is built again" -- \
  "$run" --mode decode --input "$tmp/raw.txt" "$tmp/sum.cfg" --set "run.dir=$tmp/sum_novocab"
expect 1 "decode: a missing --input file" "nosuch.txt (--input)" -- "$run" --mode decode --input "$tmp/nosuch.txt" "$tmp/sum.cfg" --set "run.dir=$tmp/sum"
expect 2 "--input needs a decoder" "only pipelines with a decoder decode raw text" -- \
  "$run" --mode decode --input "$tmp/raw.txt" "$tmp/tiny.cfg" --set "run.dir=$tmp/a"

# psm-run score: text metrics over line-aligned files, no pipeline
printf 'the cat sat on the mat . it was happy .\nsecond line\n' > "$tmp/hyp.txt"
printf 'the cat was on the mat <q> it was very happy\nsecond line\n' > "$tmp/ref.txt"
expect 0 "score: ROUGE of two files" "rouge (2 summaries):  rouge1_f 92.11" -- \
  "$run" score --metric rouge --set rouge.average=mean "$tmp/hyp.txt" "$tmp/ref.txt"
expect 0 "score: several metrics, reading a file from standard input" "repetition (2 summaries):  dup1 15.38" -- \
  sh -c "\"$run\" score --metric rouge --metric repetition - \"$tmp/ref.txt\" < \"$tmp/hyp.txt\""
printf 'one line\n' > "$tmp/short.txt"
expect 1 "score: files of different lengths" "not line-aligned: .*hyp.txt has 2 lines, .*short.txt 1" -- \
  "$run" score --metric rouge "$tmp/hyp.txt" "$tmp/short.txt"
expect 2 "score: an unknown metric" "no metric plugin named 'nosuch'" -- "$run" score --metric nosuch "$tmp/hyp.txt" "$tmp/ref.txt"
expect 2 "score: a metric of token ids" "metric 'error_rate' scores token ids" -- \
  "$run" score --metric error_rate "$tmp/hyp.txt" "$tmp/ref.txt"
expect 2 "score: a bad metric setting" "rouge.stemm: unknown key" -- \
  "$run" score --metric rouge --set rouge.stemm=false "$tmp/hyp.txt" "$tmp/ref.txt"
expect 1 "score: a missing file" "nosuch.txt (references)" -- "$run" score --metric rouge "$tmp/hyp.txt" "$tmp/nosuch.txt"
# BLEU (worked out in tests/test-metric-bleu.c): one reference file, then a
# second one of alternative references that changes the closest lengths
printf 'the cat sat on the mat\na b c d e\n' > "$tmp/bh.txt"
printf 'the cat is on the mat\na b c d f g h\n' > "$tmp/br0.txt"
printf 'x\na b c d\n' > "$tmp/br1.txt"
expect 0 "score: BLEU of one reference file (brevity penalty exp(1 - 13/11))" \
  "bleu (2 summaries):  BLEU 38.77  p1 81.82  p2 66.67  p3 42.86  p4 20.00  BP 0.83  ratio 0.85  hyp_len 11.00  ref_len 13.00" -- \
  "$run" score --metric bleu "$tmp/bh.txt" "$tmp/br0.txt"
expect 0 "score: BLEU with two reference files" "BLEU 46.50 .* ref_len 10.00" -- \
  "$run" score --metric bleu "$tmp/bh.txt" "$tmp/br0.txt" "$tmp/br1.txt"
expect 2 "score: several reference files for a metric of one reference" "2 reference files, but metric 'rouge' takes one" -- \
  "$run" score --metric bleu --metric rouge "$tmp/bh.txt" "$tmp/br0.txt" "$tmp/br1.txt"
expect 1 "score: reference files of different lengths" "not line-aligned: .*bh.txt has 2 lines, .*short.txt 1" -- \
  "$run" score --metric bleu "$tmp/bh.txt" "$tmp/br0.txt" "$tmp/short.txt"

# a language model over streams: the state carried, every position predicted
# lines counting up from a random word (mod 20): the next word is predictable
awk 'BEGIN { srand (3); for (l = 0; l < 300; l++) { n = 3 + int (rand () * 8); k = int (rand () * 20); s = "";
  for (i = 0; i < n; i++) s = s (i ? " " : "") "w" ((k + i) % 20); print s } }' > "$tmp/lm.train.txt"
head -40 "$tmp/lm.train.txt" > "$tmp/lm.valid.txt"
cat > "$tmp/lm.cfg" <<CFG
task = { plugin = "lm"; train = "$tmp/lm.train.txt"; valid = "$tmp/lm.valid.txt"; test = "$tmp/lm.valid.txt"; bptt = 10; };
model = { embedding = { dim = 16; }; encoder = { plugin = "lstm_lm"; hidden = 24; layers = 2; };
          head = { plugin = "softmax"; }; };
train = { batch = 8; steps = 120; eval_every = 60; log_every = 20; clip_norm = 0.25;
          optimizer = { name = "sgd"; lr = 20.0; }; };
eval = { batch = 5; };
run = { dir = "$tmp/lmrun"; };
metrics = ( "perplexity" );
CFG
expect 0 "lm: --check" "check: OK" -- "$run" --check "$tmp/lm.cfg"
expect 0 "lm: trains and reports the test perplexity" "test (.*perplexity" -- "$run" "$tmp/lm.cfg"
first=$(grep -m1 'valid step 60' "$tmp/out" | sed 's/.*perplexity \([0-9.]*\).*/\1/')
last=$(grep 'valid step 120' "$tmp/out" | sed 's/.*perplexity \([0-9.]*\).*/\1/')
if [ -n "$first" ] && [ -n "$last" ] && awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a && b < 15) }'; then
  ok "lm: validation perplexity falls ($first -> $last; 21 words)"
else bad "lm: validation perplexity falls ($first -> $last)"; fi
test_ppl=$(grep '^test (' "$tmp/out" | sed 's/.*perplexity \([0-9.]*\).*/\1/')
expect 0 "lm: eval in the run folder gives the same perplexity" "perplexity $test_ppl" -- \
  "$run" --mode eval "$tmp/lm.cfg"
cp -r "$tmp/lmrun" "$tmp/lmrun_novocab" && rm "$tmp/lmrun_novocab/vocab.txt"
expect 0 "lm: eval without the saved vocabulary: built again, a note, the same perplexity" \
  "vocab.txt is missing: the vocabulary is built again" -- "$run" --mode eval "$tmp/lm.cfg" --set "run.dir=$tmp/lmrun_novocab"
grep -q "perplexity $test_ppl" "$tmp/out" && ok "lm: the same perplexity with the vocabulary built again" \
  || bad "lm: the same perplexity with the vocabulary built again"
sed 's/model = {/model = { decoder = { plugin = "lstm_attn"; };/' "$tmp/lm.cfg" > "$tmp/lm_dec.cfg"
expect 2 "lm: a decoder is refused" "language model over streams" -- "$run" --check "$tmp/lm_dec.cfg"

# the pointer sentinel where only copying predicts: every line is four random
# words of 100 said twice, so its second half is in the window and nowhere
# else; at equal budget the sentinel's perplexity must be far below the
# softmax's, and its gate must go to the pointer on the repeats
awk 'BEGIN { srand (5); for (l = 0; l < 400; l++) { s = ""; for (i = 0; i < 4; i++) w[i] = "w" int (rand () * 100);
  for (i = 0; i < 8; i++) s = s (i ? " " : "") w[i % 4]; print s } }' > "$tmp/cp.train.txt"
head -50 "$tmp/cp.train.txt" > "$tmp/cp.valid.txt"
cp_cfg () {   # HEAD RUNDIR EXTRA_TRAIN OPTIMIZER
  cat <<CFG
task = { plugin = "lm"; train = "$tmp/cp.train.txt"; valid = "$tmp/cp.valid.txt"; test = "$tmp/cp.valid.txt"; bptt = 10; };
model = { embedding = { dim = 16; }; encoder = { plugin = "lstm_lm"; hidden = 32; layers = 1; dropout = 0.1; zoneout = 0.1; };
          head = { $1 }; };
train = { batch = 8; steps = 200; eval_every = 100; log_every = 50; clip_norm = 1; $3
          optimizer = { $4 }; };
eval = { batch = 5; };
run = { dir = "$tmp/$2"; };
metrics = ( "perplexity" );
CFG
}
cp_cfg 'plugin = "softmax";' cp_sm "" 'name = "adam"; lr = 0.01;' > "$tmp/cp_sm.cfg"
cp_cfg 'plugin = "pointer_sentinel"; window = 10;' cp_ps "" 'name = "adam"; lr = 0.01;' > "$tmp/cp_ps.cfg"
expect 0 "sentinel: --check" "check: OK" -- "$run" --check "$tmp/cp_ps.cfg"
"$run" -q "$tmp/cp_sm.cfg" > "$tmp/cp_sm.out" 2>&1
"$run" -q "$tmp/cp_ps.cfg" > "$tmp/cp_ps.out" 2>&1
sm=$(grep '^test (' "$tmp/cp_sm.out" | sed 's/.*perplexity \([0-9.]*\).*/\1/')
ps=$(grep '^test (' "$tmp/cp_ps.out" | sed 's/.*perplexity \([0-9.]*\).*/\1/')
if [ -n "$sm" ] && [ -n "$ps" ] && awk -v a="$sm" -v b="$ps" 'BEGIN { exit !(b < 0.5 * a) }'; then
  ok "sentinel: copies what the softmax cannot predict (perplexity $ps vs $sm)"
else cat "$tmp/cp_sm.out" "$tmp/cp_ps.out" > "$tmp/out"; bad "sentinel: copies what the softmax cannot predict ($ps vs $sm)"; fi
# Merity et al.'s k1 < k2 training: segments of 10 words 5 apart, the last
# 5 scored (k1 = 1 checked for its wiring)
sed 's/bptt = 10;/bptt = 10; stride = 5;/; s|dir = "[^"]*"|dir = "'"$tmp"'/cp_ps5"|' "$tmp/cp_ps.cfg" > "$tmp/cp_ps5.cfg"
"$run" -q "$tmp/cp_ps5.cfg" > "$tmp/cp_ps5.out" 2>&1
ps5=$(grep '^test (' "$tmp/cp_ps5.out" | sed 's/.*perplexity \([0-9.]*\).*/\1/')
if [ -n "$sm" ] && [ -n "$ps5" ] && awk -v a="$sm" -v b="$ps5" 'BEGIN { exit !(b < 0.5 * a) }'; then
  ok "sentinel: overlapping segments (stride 5 of bptt 10) learn to copy too (perplexity $ps5 vs $sm)"
else cp "$tmp/cp_ps5.out" "$tmp/out"; bad "sentinel: overlapping segments learn to copy ($ps5 vs $sm)"; fi
# --resume of a language model: the streams' position, carried state and the
# sentinel's history are in last.ckpt, so 20 + 20 steps == 40 straight
lm_steps () {   # RUNDIR STEPS [more psm-run arguments]
  lm_dir=$1; lm_n=$2; shift 2
  "$run" -q --mode train "$tmp/cp_ps5.cfg" --set "run.dir=$tmp/$lm_dir" --set train.steps=$lm_n --set train.eval_every=10 "$@"
}
lm_steps lmr_a 40 > /dev/null 2>&1
lm_steps lmr_b 20 > /dev/null 2>&1
lm_steps lmr_b 40 --resume > "$tmp/lmr.out" 2>&1
cmp -s "$tmp/lmr_a/last.ckpt" "$tmp/lmr_b/last.ckpt" && ok "lm: a resumed run ends bit-identical to the straight run" ||
  { cp "$tmp/lmr.out" "$tmp/out"; bad "lm: a resumed run ends bit-identical to the straight run"; }
cp "$tmp/lmr_b/last.ckpt" "$tmp/lmr_b.ckpt"
expect 1 "lm: --resume with another train.batch is refused" "streams are 8 (train.batch then), the pipeline asks for 4" -- \
  "$run" --mode train --resume "$tmp/cp_ps5.cfg" --set "run.dir=$tmp/lmr_b" --set train.steps=50 --set train.batch=4
cmp -s "$tmp/lmr_b/last.ckpt" "$tmp/lmr_b.ckpt" && ok "and leaves the run as it was" || bad "and leaves the run as it was"
expect 0 "sentinel: --check with stride 1 (k1 = 1, k2 = bptt)" "check: OK" -- \
  "$run" --check --set task.stride=1 "$tmp/cp_ps5.cfg"
expect 1 "lm: overlapping segments refused with an encoder built before ABI 1.7" "built for ABI 1.6 and cannot carry" -- \
  "$run" --check --set model.encoder.plugin=oldlm "$tmp/cp_ps5.cfg"
expect 2 "lm: a stride beyond bptt is refused, naming the key" "stride 11 is longer than bptt 10" -- \
  "$run" --check --set task.stride=11 "$tmp/cp_ps5.cfg"
expect 0 "sentinel: --mode decode writes per-word records and the mean gate" "mean gate .* over 449 words" -- \
  "$run" --mode decode "$tmp/cp_ps.cfg"
if awk -F '\t' 'NR % 9 >= 5 && NR % 9 <= 8 { rep += $4; nr++ } NR % 9 >= 1 && NR % 9 <= 3 { first += $4; nf++ }
    END { exit !(NF == 4 && rep / nr < 0.3 && first / nf > 0.7) }' "$tmp/cp_ps/decode.test.txt"; then
  ok "sentinel: the gate points on repeated words and generates new ones"
else cp "$tmp/cp_ps/decode.test.txt" "$tmp/out"; bad "sentinel: the gate points on repeated words and generates new ones"; fi
expect 0 "softmax LM: --mode decode writes per-word records" "per-word records written" -- \
  "$run" --mode decode "$tmp/cp_sm.cfg"
buckets="$top_srcdir/tools/psm-lm-buckets"
expect 0 "psm-lm-buckets: the Figure A1 table of two runs" "^1 .* 449 words\|words of test in 2 buckets" -- \
  "$buckets" -n 2 "$tmp/cp_sm" "$tmp/cp_ps"
expect 2 "psm-lm-buckets: usage" "usage: psm-lm-buckets" -- "$buckets" "$tmp/cp_sm"
expect 1 "psm-lm-buckets: a run without records" "decode.valid.txt: cannot read" -- \
  "$buckets" -s valid "$tmp/cp_sm" "$tmp/cp_ps"
head -100 "$tmp/cp_ps/decode.test.txt" > "$tmp/short.txt"
mkdir -p "$tmp/cp_short" && cp "$tmp/short.txt" "$tmp/cp_short/decode.test.txt"
expect 1 "psm-lm-buckets: B has fewer records than A" "cp_short/decode.test.txt: fewer records than" -- \
  "$buckets" "$tmp/cp_ps" "$tmp/cp_short"
cp "$tmp/cp_sm/vocab.txt" "$tmp/cp_short/"
expect 1 "psm-lm-buckets: B has more records than A" "cp_ps/decode.test.txt: more records than" -- \
  "$buckets" "$tmp/cp_short" "$tmp/cp_ps"

# the plateau schedule and early stopping (Merity et al. 5.2)
cp_cfg 'plugin = "softmax";' cp_pat "patience = 2; eval_every = 20;" 'name = "adam"; lr = 0.0;' |
  sed 's/eval_every = 100;//' > "$tmp/cp_pat.cfg"
expect 0 "train.patience: stops after 2 validations without a new best" \
  "stopping at step 60: 2 validations without improving on the best" -- "$run" --mode train "$tmp/cp_pat.cfg"
expect 0 "train.patience: --resume after an early stop trains nothing" "nothing to train: .* stopped at step 60" -- \
  "$run" --mode train --resume "$tmp/cp_pat.cfg"
cp_cfg 'plugin = "softmax";' cp_pl "eval_every = 20;" 'name = "adam"; lr = 0.3; plateau_factor = 0.5;' |
  sed 's/eval_every = 100;//' > "$tmp/cp_pl.cfg"
expect 0 "plateau_factor: lr halved after a worse validation" "validation worse than the one before: learning rate now 0.15" -- \
  "$run" --mode train "$tmp/cp_pl.cfg"
# (how many validations get worse depends on the run's random draws: one
# halving at least, and the training records after it carry the rate)
if grep -q '"split": "train".*"lr": 0\.\(15\|075\),' "$tmp/cp_pl/log.jsonl"; then ok "plateau_factor: the log records the halved rate"
else cp "$tmp/cp_pl/log.jsonl" "$tmp/out"; bad "plateau_factor: the log records the halved rate"; fi

# headline generation with the pointer softmax (Gulcehre et al. 5.2): every
# name is seen once, so it is <unk> in both vocabularies; the UNK-pointers
# teach the model to point at it, and decoding outputs the name itself
hl_pairs () {   # hl_pairs FIRST LAST PREFIX: article and title files of names FIRST..LAST
  for name in $(seq "$1" "$2"); do
    case $((name % 3)) in
    0) echo "police arrest x${name}q in paris .	police arrest x${name}q" ;;
    1) echo "x${name}q wins the race on sunday .	x${name}q wins race" ;;
    2) echo "the minister met x${name}q in rome .	minister meets x${name}q" ;;
    esac
  done > "$tmp/$3.tsv"
  cut -f1 "$tmp/$3.tsv" > "$tmp/$3.article.txt"
  cut -f2 "$tmp/$3.tsv" > "$tmp/$3.title.txt"
}
hl_pairs 0 59 hl_tr
hl_pairs 100 105 hl_te
cat > "$tmp/hl.cfg" <<CFG
task = { plugin = "headline"; train = "$tmp/hl_tr.article.txt"; valid = "$tmp/hl_te.article.txt";
         test = "$tmp/hl_te.article.txt"; min_count = 2; style = "none"; lvt = 8; };
model = { embedding = { dim = 16; }; encoder = { plugin = "bigru"; hidden = 16; }; decoder = { plugin = "gru_attn"; hidden = 16; };
          head = { plugin = "pointer_softmax"; hidden = 16; switch_hidden = 16; temperature = 1.0; }; };
train = { batch = 10; steps = 300; eval_every = 300; log_every = 100; optimizer = { name = "adam"; lr = 0.01; }; };
eval = { batch = 8; };
decode = { beam = 2; min_len = 1; max_len = 6; };
metrics = ( "rouge" );
CFG
expect 0 "headline: the pointer softmax trains on UNK-pointers (lvt 8)" "unk-pointers per 100 examples: train 100.0" -- \
  "$run" "$tmp/hl.cfg" --set "run.dir=$tmp/hl_ps"
copied=$(awk '{ for (i = 1; i <= NF; i++) if ($i ~ /^x10[0-5]q$/) n++ } END { print n + 0 }' "$tmp/hl_ps/decode.test.txt")
[ "$copied" -ge 5 ] && ok "headline: words outside both vocabularies reach the output ($copied of 6 test names)" \
  || { cp "$tmp/hl_ps/decode.test.txt" "$tmp/out"; bad "headline: names reach the output ($copied of 6)"; }
printf 'The minister met X999Q in Rome.\n' > "$tmp/hl_raw.txt"
expect 0 "headline: raw text decodes with the name pointed at" "x999q" -- \
  "$run" --mode decode --input "$tmp/hl_raw.txt" "$tmp/hl.cfg" --set "run.dir=$tmp/hl_ps"
cp -r "$tmp/hl_ps" "$tmp/hl_novocab" && rm "$tmp/hl_novocab/tgt_vocab.txt"
expect 0 "headline: without the saved vocabularies, a note that they are built again" \
  "tgt_vocab.txt is missing: the vocabularies are built again" -- \
  "$run" --mode decode --input "$tmp/hl_raw.txt" "$tmp/hl.cfg" --set "run.dir=$tmp/hl_novocab"
expect 0 "headline: the softmax model of the same data" "check: OK" -- \
  "$run" --check "$tmp/hl.cfg" --set model.head.plugin=softmax
# decoding a run that reached its second phase builds that phase's model
# only (the task, which logs its vocabularies when created, once)
expect 0 "headline: a two-phase run trains" "second phase" -- "$run" "$tmp/hl.cfg" --mode train \
  --set "run.dir=$tmp/hl_2ph" --set train.steps=4 --set train.eval_every=4 --set continue.steps=2
expect 0 "headline: raw text decodes from the second phase" "decoded 1 text .*(step 6)" -- \
  "$run" --mode decode --input "$tmp/hl_raw.txt" "$tmp/hl.cfg" --set "run.dir=$tmp/hl_2ph" --set continue.steps=2
[ "$(grep -c '^headline: vocabularies' "$tmp/out")" -eq 1 ] && ok "decoding a two-phase run builds one model" \
  || bad "decoding a two-phase run builds one model"

# decode.sort: articles of 3 to 36 words in batches of 4, decoded in order of
# length and in the split's order; the same files and scores either way
for i in 1 12 3 9 2 11 5 7 4 10 6 8; do
  words=$(for j in $(seq "$i"); do printf 'police arrest x%sq in paris . ' "$j"; done)
  echo "$words" | cut -d' ' -f1-$((3 * i))
done > "$tmp/hl_len.article.txt"
sed 's/ in paris.*//' "$tmp/hl_len.article.txt" > "$tmp/hl_len.title.txt"
for s in true false; do
  "$run" --mode decode --json "$tmp/hl.cfg" --set "run.dir=$tmp/hl_ps" --set task.lvt=0 \
    --set "task.test=$tmp/hl_len.article.txt" --set decode.sort=$s > "$tmp/sort_$s.out" 2>&1 || bad "decode.sort=$s: exit status" "$tmp/sort_$s.out"
  for f in decode.test.txt reference.test.txt decode.test.jsonl; do cp "$tmp/hl_ps/$f" "$tmp/sort_$s.$f"; done
done
if cmp -s "$tmp/sort_true.decode.test.txt" "$tmp/sort_false.decode.test.txt" &&
   cmp -s "$tmp/sort_true.reference.test.txt" "$tmp/sort_false.reference.test.txt" &&
   [ "$(wc -l < "$tmp/sort_true.decode.test.txt")" -eq 12 ] &&
   [ "$(sed -n 's/^{"example": \([0-9]*\),.*/\1/p' "$tmp/sort_true.decode.test.jsonl" | tr '\n' ' ')" = "0 1 2 3 4 5 6 7 8 9 10 11 " ] &&
   [ "$(grep '^test' "$tmp/sort_true.out")" = "$(grep '^test' "$tmp/sort_false.out")" ]; then
  ok "decode.sort: summaries, references, JSON records and scores in the split's order"
else
  cat "$tmp/sort_true.out" "$tmp/sort_false.out" > "$tmp/out"; bad "decode.sort: outputs as unsorted"
fi
# decode.precision bf16: the products on AMX tiles where the CPU has them
# (its flags in /proc/cpuinfo), else and with PSM_NO_AMX=1 the rounded
# operands on the single-precision kernel; every sentence decoded either
# way; an unknown precision refused by name
if grep -q 'amx_bf16' /proc/cpuinfo 2>/dev/null; then
  amx_says="bf16 products on AMX tiles"
else
  amx_says="bf16 operands on the single-precision kernel (no AMX here)"
fi
for v in "" 1; do
  what="decode.precision bf16${v:+ with PSM_NO_AMX=1}"
  pat=$amx_says
  [ -n "$v" ] && pat="bf16 operands on the single-precision kernel (no AMX here)"
  expect 0 "$what: says $pat" "$pat" -- env PSM_NO_AMX=$v "$run" --mode decode "$tmp/hl.cfg" \
    --set "run.dir=$tmp/hl_ps" --set task.lvt=0 --set "task.test=$tmp/hl_len.article.txt" --set 'decode.precision="bf16"'
  [ "$(wc -l < "$tmp/hl_ps/decode.test.txt")" -eq 12 ] && ok "$what: 12 summaries" || bad "$what: 12 summaries"
done
# the read-again LSTM's importance (inspection only) is computed when
# decoding writes JSON, the one place that reads it (PsmEncoding.want_importance)
sed -e 's/encoder = { plugin = "bigru"; hidden = 16; }; decoder = { plugin = "gru_attn"; hidden = 16; };/encoder = { plugin = "readagain_lstm"; hidden = 16; }; decoder = { plugin = "lstm_attn"; hidden = 16; init = "bridge"; };/' \
    -e 's/head = { plugin = "pointer_softmax";[^}]*}/head = { plugin = "copy"; }/' -e 's/lvt = 8;//' "$tmp/hl.cfg" > "$tmp/hl_ra.cfg"
expect 0 "headline: a read-again LSTM with copy trains" "test" -- "$run" "$tmp/hl_ra.cfg" --set "run.dir=$tmp/hl_ra" \
  --set train.steps=4 --set train.eval_every=4
expect 0 "read-again LSTM: decodes with --json" "summaries written" -- \
  "$run" --mode decode --json "$tmp/hl_ra.cfg" --set "run.dir=$tmp/hl_ra"
[ "$(grep -c '"importance": \[0\.' "$tmp/hl_ra/decode.test.jsonl")" -eq "$(wc -l < "$tmp/hl_ra/decode.test.txt")" ] \
  && ok "read-again LSTM: every JSON record has its importance" \
  || { cp "$tmp/hl_ra/decode.test.jsonl" "$tmp/out"; bad "read-again LSTM: importance in the JSON records"; }
expect 2 "decode.precision: an unknown value is refused by name" 'decode.precision.*unknown value "fp16"' -- \
  "$run" --mode decode "$tmp/hl.cfg" --set "run.dir=$tmp/hl_ps" --set 'decode.precision="fp16"'
cp "$tmp/hl_ps/decode.test.txt" "$tmp/sort_before.txt"
expect 1 "decode.sort: no scratch file is an error that says how to do without" \
  "cannot create a scratch file.*decode.sort = false" -- env TMPDIR="$tmp/nosuchdir" "$run" --mode decode "$tmp/hl.cfg" \
  --set "run.dir=$tmp/hl_ps" --set task.lvt=0 --set "task.test=$tmp/hl_len.article.txt"
cmp -s "$tmp/sort_before.txt" "$tmp/hl_ps/decode.test.txt" && ok "decode.sort: the earlier summaries are kept" \
  || bad "decode.sort: the earlier summaries were lost"
pad_sorted=$(sed -n 's/.*source padding \([0-9.]*\)%.*/\1/p' "$tmp/sort_true.out")
pad_split=$(sed -n 's/.*source padding \([0-9.]*\)%.*/\1/p' "$tmp/sort_false.out")
# 234 words; batches 1 12 3 9 | 2 11 5 7 | 4 10 6 8 pad to 3 (36 + 33 + 30) x 4 = 396
# positions (40.9 % padding), batches by length 1 2 3 4 | ... to 3 (12 + 24 + 36) x 4 = 288 (18.8 %)
[ "$pad_split" = 40.9 ] && [ "$pad_sorted" = 18.8 ] && ok "decode.sort: padding 40.9 % -> 18.8 %" \
  || { cat "$tmp/sort_true.out" > "$tmp/out"; bad "decode.sort: padding $pad_split % -> $pad_sorted %"; }

# hostile input to the readers (issue 58)
# @include paths are relative to the file that holds them, nested ones too
mkdir -p "$tmp/inc/sub" "$tmp/inc/blocks"
printf '@include "inner.cfg"\ntrain = { batch = 16; steps = 4; eval_every = 2; log_every = 2;\n  optimizer = { name = "adam"; lr = 0.01; }; };\n' \
  > "$tmp/inc/blocks/outer.cfg"
sed -n '/^task/,/^          head/p' "$tmp/tiny.cfg" > "$tmp/inc/blocks/inner.cfg"
printf '@include "../blocks/outer.cfg"\neval = { batch = 25; };\nmetrics = ( "error_rate" );\n' > "$tmp/inc/sub/top.cfg"
expect 0 "nested @include: each path relative to its own file" "check: OK" -- "$run" --check "$tmp/inc/sub/top.cfg"
sed -i 's/hidden = 16; attn_dim/hidden = 16; nosuch = 1; attn_dim/' "$tmp/inc/blocks/inner.cfg"
expect 2 "an error in a nested @include names that file and line" "inner.cfg:5: model.head.nosuch: unknown" -- \
  "$run" --check "$tmp/inc/sub/top.cfg"
printf '# a comment\ntask = { plugin = ; };\n' > "$tmp/inc/blocks/inner.cfg"
expect 2 "a parse error in a nested @include names that file and line" "inner.cfg:2: parse error" -- \
  "$run" --check "$tmp/inc/sub/top.cfg"
printf '@include "outer.cfg"\n' > "$tmp/inc/blocks/inner.cfg"
expect 2 "an @include circle ends with a message" "@include nested more than 10 deep" -- "$run" --check "$tmp/inc/sub/top.cfg"
# a plugin name cannot leave the plugin folders, and no constructor of a file outside them runs
mkdir -p "$tmp/plug/psm-task-x"
printf '#include <stdio.h>\n__attribute__ ((constructor)) static void pwn (void) { fclose (fopen ("%s/pwned", "w")); }\n' "$tmp" \
  > "$tmp/evil.c"
if cc -shared -fPIC -o "$tmp/evil.so" "$tmp/evil.c" 2> /dev/null; then
  expect 2 "plugin = \"x/../../evil\" is refused by name" "invalid task plugin name 'x/../../evil'" -- \
    env PSM_PLUGIN_PATH="$tmp/plug:$PSM_PLUGIN_PATH" "$run" --check "$tmp/tiny.cfg" --set 'task.plugin="x/../../evil"'
  [ ! -e "$tmp/pwned" ] && ok "and evil.so was never loaded" || bad "evil.so's constructor ran"
fi
# the cnndm reader: a byte-order mark, and nesting deeper than it takes
{ printf '\357\273\277'; cat "$tmp/sum.jsonl"; { printf '{"article": "a b .", "highlights": "c .", "x": '
  head -c 200000 /dev/zero | tr '\0' '['; printf '}\n'; }; } > "$tmp/bom.jsonl"
expect 0 "a jsonl with a byte-order mark and a line nested 200,000 deep: read, the line skipped by number" \
  "bom.jsonl: skipped 1 bad record (line 7; first: invalid JSON: arrays and objects nested more than 64 levels deep)" -- \
  "$run" --check "$tmp/sum.cfg" --set "task.train=\"$tmp/bom.jsonl\""

# OMP_THREAD_LIMIT below the threads asked for: OpenBLAS's OpenMP build hung here
expect 0 "OMP_THREAD_LIMIT below OMP_NUM_THREADS does not hang" "check: OK" -- \
  env OMP_NUM_THREADS=4 OMP_THREAD_LIMIT=2 timeout 300 "$run" --check "$tmp/tiny.cfg"

finish
