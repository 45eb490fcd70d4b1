# bash completion for psm-run: sub-commands, options, their values, pipeline
# files, run folders and plugin names (read from psm-run --list).
# Installed as $(datadir)/bash-completion/completions/psm-run.

_psm_run_plugins ()
{
  # "  name — description" lines of --list, optionally only one kind's block
  "${1:-psm-run}" --list 2>/dev/null | awk -v kind="$2" '
    /^[a-z]+s:$/ { cur = substr($1, 1, length($1) - 2) }
    /^core sections:$/ { cur = "core" }
    /^  [a-z_0-9.]+ — / { if (kind == "" || kind == cur) print $1 }'
}

_psm_run ()
{
  local cur prev words cword
  if declare -F _init_completion > /dev/null; then
    _init_completion -n = || return
  else
    cur=${COMP_WORDS[COMP_CWORD]}
    prev=${COMP_WORDS[COMP_CWORD - 1]}
    words=("${COMP_WORDS[@]}")
    cword=$COMP_CWORD
  fi
  local cmd=${words[0]}
  local sub="" i
  for ((i = 1; i < cword; i++)); do
    case ${words[i]} in
      score | view | plot | serve | convert) sub=${words[i]}; break ;;
    esac
  done

  case $prev in
    --mode | -m) COMPREPLY=($(compgen -W "all train eval decode" -- "$cur")); return ;;
    --format | -f) COMPREPLY=($(compgen -W "see-bin jsonl csv" -- "$cur")); return ;;
    --tokenize | -t) COMPREPLY=($(compgen -W "yes no auto" -- "$cur")); return ;;
    --split) COMPREPLY=($(compgen -W "valid test" -- "$cur")); return ;;
    --describe)
      COMPREPLY=($(compgen -W "$(_psm_run_plugins "$cmd")" -- "$cur")); return ;;
    --metric) COMPREPLY=($(compgen -W "$(_psm_run_plugins "$cmd" metric)" -- "$cur")); return ;;
    --input | -i | --source | --output | -o)
      COMPREPLY=($(compgen -f -- "$cur")); compopt -o filenames 2> /dev/null; return ;;
    --stop-after | --port | --sep | --set | -s | --host | --examples | -n | --max-body | --queue | --batch-wait | --max-connections | --header-timeout | --max) return ;;
  esac

  if [[ $cur == -* ]]; then
    local opts="--help --set --mode --split --resume --stop-after --check --list --describe --quiet --profile
                --json --input --version"
    case $sub in
      score) opts="--help --metric --sep --source --set" ;;
      view) opts="--help --output --examples --split" ;;
      plot) opts="--help --output" ;;
      serve) opts="--help --port --host --queue --max-body --max-connections --header-timeout --batch-wait --set --quiet" ;;
      convert) opts="--help --output --format --tokenize --max" ;;
    esac
    COMPREPLY=($(compgen -W "$opts" -- "$cur"))
    return
  fi
  case $sub in
    score | convert) COMPREPLY=($(compgen -f -- "$cur")); compopt -o filenames 2> /dev/null ;;
    view) COMPREPLY=($(compgen -f -X '!*.jsonl' -- "$cur") $(compgen -d -- "$cur")); compopt -o filenames 2> /dev/null ;;
    plot | serve) COMPREPLY=($(compgen -d -- "$cur")); compopt -o filenames 2> /dev/null ;;
    *)
      COMPREPLY=($(compgen -W "score view plot serve convert" -- "$cur") $(compgen -f -X '!*.cfg' -- "$cur")
                 $(compgen -d -- "$cur"))
      compopt -o filenames 2> /dev/null ;;
  esac
}
complete -F _psm_run psm-run
