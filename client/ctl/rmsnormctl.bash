# SPDX-License-Identifier: MIT
# bash completion for rmsnormctl (installed as
# $PREFIX/share/bash-completion/completions/rmsnormctl).
_rmsnormctl()
{
    local cur prev cmd i
    cur=${COMP_WORDS[COMP_CWORD]}
    prev=${COMP_WORDS[COMP_CWORD-1]}
    case $prev in
    -e|--endpoint)
        # An endpoint is an ipc:// URL or a socket path.
        COMPREPLY=($(compgen -f -- "$cur")); return ;;
    -t|--timeout|-c|--count|-k|--clients|-r|--requests|--m|--n|-o|--output|--dtype)
        [ "$prev" = -o ] || [ "$prev" = --output ] && COMPREPLY=($(compgen -f -- "$cur"))
        [ "$prev" = --dtype ] && COMPREPLY=($(compgen -W "bf16 f16 f32" -- "$cur"))
        return ;;
    esac
    cmd=
    for ((i = 1; i < COMP_CWORD; i++)); do
        case ${COMP_WORDS[i]} in
        -e|--endpoint|-t|--timeout) ((i++)) ;;
        -*) ;;
        *) cmd=${COMP_WORDS[i]}; break ;;
        esac
    done
    if [ -z "$cmd" ]; then
        COMPREPLY=($(compgen -W "health stats info ping selftest bench version help
                                 --endpoint --timeout --help --version" -- "$cur"))
        return
    fi
    case $cmd in
    health) COMPREPLY=($(compgen -W "-q --quiet --help" -- "$cur")) ;;
    stats) COMPREPLY=($(compgen -W "--json --prometheus -o --output --help" -- "$cur")) ;;
    selftest) COMPREPLY=($(compgen -W "-v --verbose --help" -- "$cur")) ;;
    ping) COMPREPLY=($(compgen -W "-c --count --help" -- "$cur")) ;;
    bench) COMPREPLY=($(compgen -W "-k --clients -r --requests --m --n --dtype --help" -- "$cur")) ;;
    *) COMPREPLY=($(compgen -W "--help" -- "$cur")) ;;
    esac
}
complete -F _rmsnormctl rmsnormctl
