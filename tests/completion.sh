#!/bin/sh
# The bash completion of psm-run (tools/psm-run.bash): sub-commands,
# options, --mode values, plugin names after --describe and --metric,
# pipeline files. Runs the completion function in bash as bash would.
set -u
command -v bash > /dev/null 2>&1 || { echo "SKIP: bash is not installed"; exit 77; }
tmp=$(mktemp -d "${TMPDIR:-/tmp}/psm-completion-XXXXXX")
trap 'rm -rf "$tmp"' EXIT
mkdir "$tmp/runs" && : > "$tmp/a.cfg" && : > "$tmp/b.txt"
cat > "$tmp/psm-run" <<SH
#!/bin/sh
PSM_PLUGIN_PATH="$top_builddir/plugins/.libs" exec "$top_builddir/tools/psm-run" "\$@"
SH
chmod +x "$tmp/psm-run"
# (not exec: the trap removes $tmp when bash is done)
cd "$tmp" && bash -c '
. "$1"
n=0 fails=0
# complete "WORDS..." EXPECTED-WORD [ABSENT-WORD]: the last word is the one completed
check () {
  read -r -a COMP_WORDS <<< "$1"
  case $1 in *" ") COMP_WORDS+=("") ;; esac
  COMP_CWORD=$((${#COMP_WORDS[@]} - 1))
  COMPREPLY=()
  _psm_run
  n=$((n + 1))
  got=" ${COMPREPLY[*]} "
  if [[ $got == *" $2 "* ]] && { [ -z "${3:-}" ] || [[ $got != *" $3 "* ]]; }; then
    echo "ok $n - \"$1\" -> $2"
  else
    fails=$((fails + 1)); echo "not ok $n - \"$1\": wanted $2${3:+, not $3}; got:$got"
  fi
}
check "./psm-run " score
check "./psm-run " a.cfg b.txt
check "./psm-run s" serve
check "./psm-run --mo" --mode
check "./psm-run --mode d" decode
check "./psm-run --split " valid
check "./psm-run --describe pointer_g" pointer_generator
check "./psm-run --describe " train.optimizer
check "./psm-run score --metric r" rouge repetition_x
check "./psm-run score --metric " bleu softmax
check "./psm-run serve --p" --port
check "./psm-run serve --b" --batch-wait
check "./psm-run view --split " valid
check "./psm-run view --" --output --resume
check "./psm-run plot r" runs a.cfg
check "./psm-run c" convert
check "./psm-run convert --format " see-bin
check "./psm-run convert --t" --tokenize
echo "Checks: $n, Failures: $fails"
[ "$fails" -eq 0 ]
' completion "$top_srcdir/tools/psm-run.bash"
exit $?
