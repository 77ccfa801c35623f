#!/bin/sh
# episode-operator in-pod job supervisor.
#
# The operator never holds an exec stream for the lifetime of a command. It places this
# script in the pod (/episode-operator/supervisor.sh, an emptyDir shared by the pod's
# containers) and runs every command as a *job*: one short exec starts it detached, bounded
# long-poll execs wait for it, and its exit code is written atomically to a file. Starting a
# job whose id exists only reports its state, so a restarted operator or a dropped websocket
# never runs a command twice and never loses an exit code. supervisor.py builds the argv of
# every verb and parses every answer; see its docstring for the protocol.
#
# Portability: POSIX sh only (dash, busybox ash). Tools: coreutils or busybox; util-linux
# (setsid, setpriv, runuser) and GNU tar are used when present.
#
# Layout, relative to this script's directory:
#   workdir           the working directory of the last placement's exec (the container's)
#   workdir.<mntns>   the same per container (mount namespace): jobs default to it
#   tmp/              scratch files of the verbs
#   jobs/<id>/        one job: created, command, shell, cwd, output_path, output, output_offset,
#                     timeout, kill_after, user, env/<NAME>, runner, grouped, jobpid, started_at,
#                     timed_out, finished_at, and exactly one of exit | unstartable | lost once done.
#
# Exit status of a verb: 0 done (a job's own failure is reported in its state, not here),
# 1 the operation failed, 2 the call was malformed; the message is one line on stderr.

SUPERVISOR_VERSION=1
SELF=$0
case $SELF in /*) ;; *) SELF=$PWD/$SELF ;; esac
BASE=${SELF%/*}
JOBS=$BASE/jobs
TMPD=$BASE/tmp
NL='
'
SQ="'"

# ---------------------------------------------------------------------------- helpers

# One line on stderr, then exit (1: failed, 2: malformed call).
die() {
    printf 'supervisor: %s\n' "$(printf '%s' "$1" | tr '\n\r' '  ')" >&2
    exit "${2:-1}"
}

usage() { die "usage: $1" 2; }

# Percent-encode $1 (bytes outside [A-Za-z0-9,-./:_~] become %XX), without a newline.
pct() {
    [ -n "$1" ] || return 0
    case $1 in
        *[!A-Za-z0-9,./:_~-]*) ;;
        *) printf '%s' "$1"; return 0 ;; # nothing to encode (most paths): no od
    esac
    printf '%s' "$1" | od -An -v -tx1 | while read -r _pl; do
        for _ph in $_pl; do
            case $_ph in
                3[0-9] | 4[1-9a-f] | 5[0-9a] | 6[1-9a-f] | 7[0-9a] | 2[c-f] | 3a | 5f | 7e)
                    _pv=$((0x$_ph))
                    # shellcheck disable=SC2059 # an octal escape built from a checked byte
                    printf "\\$((_pv / 64))$((_pv / 8 % 8))$((_pv % 8))"
                    ;;
                *) printf '%%%s' "$_ph" ;;
            esac
        done
    done
}

# Epoch seconds, with a fraction where date supports %N (GNU), whole seconds otherwise.
now() {
    _nt=$(date +%s.%N 2>/dev/null)
    case $_nt in '' | *[!0-9.]*) _nt=$(date +%s) ;; esac
    printf '%s' "$_nt"
}

# Write $2 to file $1 atomically (a reader sees the old file, no file, or all of $2).
put() {
    printf '%s' "$2" >"$1.tmp.$$" && mv -f "$1.tmp.$$" "$1"
}

# Write $2 to file $1 in place (no mv to exec): for the spec of a job whose directory was just
# created, which nothing reads before the runner is launched, and for short fields written
# once, in one write, that a reader takes for absent while empty.
write() {
    printf '%s' "$2" >"$1"
}

# The first line of file $1 into $_got, without a fork: for fields that hold no newline.
get_line() {
    _got=
    [ -r "$1" ] || return 1
    IFS= read -r _got <"$1" || [ -n "$_got" ]
}

# The exact content of file $1 (trailing newlines kept) into $_got; status 1 if unreadable.
# Builtins only (no fork): for the small fields of a job and the supervisor's records.
get() {
    _got=
    _gs=
    _gl=
    { while IFS= read -r _gl; do
        _got=$_got$_gs$_gl
        _gs=$NL
    done; } 2>/dev/null <"$1" || return 1
    _got=$_got$_gs$_gl
}

# The path of program $1 as `command -v` finds it on $PATH, into $_fp, without a fork; status
# 1 when there is none. (Resolved before a job's environment, with its PATH, is applied.)
find_prog() {
    _fp=
    case $1 in
        */*)
            [ -f "$1" ] && [ -x "$1" ] && _fp=$1
            [ -n "$_fp" ]
            return
            ;;
    esac
    _fps=$PATH:
    while [ -n "$_fps" ]; do
        _fpd=${_fps%%:*}
        _fps=${_fps#*:}
        if [ -f "${_fpd:-.}/$1" ] && [ -x "${_fpd:-.}/$1" ]; then
            _fp=${_fpd:-.}/$1
            return 0
        fi
    done
    return 1
}

# A non-negative decimal number: digits, optionally a dot and digits.
is_num() {
    case $1 in '' | .* | *. | *[!0-9.]* | *.*.*) return 1 ;; esac
}

# Integer part of decimal $1 without leading zeros (sh arithmetic reads 08 as octal).
int_part() {
    _ip=${1%%.*}
    _ip=${_ip#"${_ip%%[!0]*}"}
    printf '%s' "${_ip:-0}"
}

# Decimal $1 rounded up to whole seconds.
ceil() {
    _ci=$(int_part "$1")
    case $1 in *.*[1-9]*) _ci=$((_ci + 1)) ;; esac
    printf '%s' "$_ci"
}

# Decimal $1 in hundredths of a second (truncated).
hundredths() {
    _ti=$(int_part "$1")
    _tf=
    case $1 in *.*) _tf=${1#*.}00 ;; *) _tf=00 ;; esac
    _tf=${_tf%"${_tf#??}"}
    _tf=${_tf#0}
    printf '%s' $((_ti * 100 + _tf))
}

# Does `sleep` take fractions (GNU, busybox: yes; strict POSIX: no)? Answer cached.
FRAC_SLEEP=
frac_sleep() {
    if [ -z "$FRAC_SLEEP" ]; then
        if sleep 0.01 2>/dev/null; then FRAC_SLEEP=1; else FRAC_SLEEP=0; fi
    fi
    [ "$FRAC_SLEEP" = 1 ]
}

# Sleep $1 seconds (rounded up where sleep takes no fractions).
nap() {
    if frac_sleep; then sleep "$1"; else sleep "$(ceil "$1")"; fi
}

has() { command -v "$1" >/dev/null 2>&1; }

check_id() {
    case $1 in '' | .* | *[!A-Za-z0-9._-]*) die "invalid job id (want [A-Za-z0-9._-]+, not starting with a dot): $1" 2 ;; esac
    [ ${#1} -le 200 ] || die "job id longer than 200 characters" 2
}

# This container as digits, into $_mn ("" if unknown): containers of a pod share this
# directory, so placement records the working directory per container, and what a verb
# learns of the container's tools is kept per container. The id of the first mount in
# /proc/self/mountinfo, the container's root: mount ids are unique among the mounts that
# exist, and each container (mount namespace) has its own root mount. Read with a builtin.
container_key() {
    _mn=
    { IFS=' ' read -r _mn _ckr </proc/self/mountinfo; } 2>/dev/null
    case $_mn in '' | *[!0-9]*) _mn= ;; esac
}

# This pid namespace, as far as a runner's record needs it, into $_pns: the container and the
# start time of its pid 1 (a restarted container has a new one). Builtins only.
pid_space() {
    [ -n "${_mn-}" ] || container_key
    _pns=
    _p1=
    { read -r _p1 </proc/1/stat; } 2>/dev/null
    # shellcheck disable=SC2086 # fields after "pid (comm) ": state is 1st, starttime 20th
    [ -n "$_p1" ] && set -- ${_p1##*) } && [ $# -ge 20 ] && _pns=$_mn:${20}
}

# The working directory recorded at placement in this container ($_mn), else at the last
# placement, else /, into $_wdir.
default_workdir() {
    [ -n "${_mn-}" ] || container_key
    for _wf in ${_mn:+"$BASE/workdir.$_mn"} "$BASE/workdir"; do
        if [ -f "$_wf" ] && get "$_wf" && [ -n "$_got" ]; then
            _wdir=$_got
            return 0
        fi
    done
    _wdir=/
}

# Look a user up by name or uid: sets PW_NAME PW_UID PW_GID PW_HOME; status 1 if absent.
pw_lookup() {
    PW_NAME='' PW_UID='' PW_GID='' PW_HOME=''
    _pe=
    if has getent; then
        _pe=$(getent passwd "$1" 2>/dev/null)
        _pe=${_pe%%"$NL"*}
    fi
    if [ -z "$_pe" ] && [ -r /etc/passwd ]; then
        while IFS= read -r _pline || [ -n "$_pline" ]; do
            _pn=${_pline%%:*}
            _pr=${_pline#*:}
            _pr=${_pr#*:}
            _pu=${_pr%%:*}
            if [ "$_pn" = "$1" ] || [ "$_pu" = "$1" ]; then
                _pe=$_pline
                break
            fi
        done </etc/passwd
    fi
    [ -n "$_pe" ] || return 1
    PW_NAME=${_pe%%:*}
    _pr=${_pe#*:}
    _pr=${_pr#*:}
    PW_UID=${_pr%%:*}
    _pr=${_pr#*:}
    PW_GID=${_pr%%:*}
    _pr=${_pr#*:}
    _pr=${_pr#*:}
    PW_HOME=${_pr%%:*}
    return 0
}

# util-linux setpriv (busybox's cannot change uids). Asked once per container.
setpriv_switches() {
    has setpriv || return 1
    [ -n "${_mn-}" ] || container_key
    _spc=
    [ -z "$_mn" ] || _spc=$BASE/setpriv.$_mn
    if [ -n "$_spc" ] && get_line "$_spc" && [ -n "$_got" ]; then
        [ "$_got" = 1 ]
        return
    fi
    _spa=0
    case $(setpriv --help 2>&1) in *--reuid*) _spa=1 ;; esac
    [ -z "$_spc" ] || put "$_spc" "$_spa"
    [ "$_spa" = 1 ]
}

# Which tar, into $_tf: gnu, busybox or other ("" when absent). Asked once per container.
tar_flavor() {
    _tf=
    has tar || return 0
    [ -n "${_mn-}" ] || container_key
    _tfc=
    [ -z "$_mn" ] || _tfc=$BASE/tar.$_mn
    if [ -n "$_tfc" ] && get_line "$_tfc" && [ -n "$_got" ]; then
        _tf=$_got
        return 0
    fi
    case $(tar --version 2>&1) in
        *'GNU tar'*) _tf=gnu ;;
        *BusyBox*) _tf=busybox ;;
        *) case $(tar --help 2>&1) in *BusyBox*) _tf=busybox ;; *) _tf=other ;; esac ;;
    esac
    [ -z "$_tfc" ] || put "$_tfc" "$_tf"
}

# ------------------------------------------------------------------------- job state

# A job is done once exactly one of exit, unstartable, lost exists. The runner writes exit
# in place (one short write: a reader sees it empty or whole), so it counts once non-empty.
is_done() {
    [ -s "$1/exit" ] || [ -f "$1/unstartable" ] || [ -f "$1/lost" ]
}

# Kill target of a job: -PGID when it has its own process group, else its pid.
job_target() {
    get "$1/jobpid" || return 1
    _jt=${_got%%[!0-9]*}
    [ -n "$_jt" ] || return 1
    if [ -f "$1/grouped" ]; then printf '%s' "-$_jt"; else printf '%s' "$_jt"; fi
}

# Is the runner recorded in job dir $1 alive? Status 1 only when sure it is gone: it ran in
# this pid namespace (the same container incarnation) and /proc shows no such process (a
# zombie or a reused pid counts as gone). From another container we cannot tell: alive.
runner_alive() {
    [ -r /proc/self/stat ] || return 0
    get "$1/runner" || return 0
    # shellcheck disable=SC2086 # fields: pid starttime pidns
    set -- $_got
    [ $# -ge 3 ] || return 0
    _rpid=$1 _rstart=$2 _rns=$3
    pid_space
    [ -n "$_pns" ] && [ "$_pns" = "$_rns" ] || return 0
    _st=
    { read -r _st <"/proc/$_rpid/stat"; } 2>/dev/null || [ -n "$_st" ] || return 1
    # shellcheck disable=SC2086 # fields after "pid (comm) ": state is 1st, starttime 20th
    set -- ${_st##*) }
    [ $# -ge 20 ] || return 1
    [ "$1" != Z ] && [ "${20}" = "$_rstart" ]
}

# Record a job whose runner vanished (killed, e.g. by an agent's `kill -9 -1`) or was never
# launched as lost, killing whatever is left of it: it must not run on unbounded.
check_lost() {
    is_done "$1" && return 0
    if [ -f "$1/runner" ]; then
        runner_alive "$1" && return 0
        _why='lost: the supervising process died without recording an exit code'
    elif [ -f "$1/created" ]; then
        # Rare (a start exec killed before it launched the runner): forks are fine here. Its age
        # is its modification time's.
        [ -n "$(find "$1/created" -mmin +1 2>/dev/null)" ] || return 0
        _why='lost: the job was never launched'
    else
        return 0
    fi
    is_done "$1" && return 0
    if _tg=$(job_target "$1"); then kill -KILL "$_tg" 2>/dev/null; fi
    [ -f "$1/finished_at" ] || put "$1/finished_at" "$(now)"
    put "$1/lost" "$_why"
}

# The one-line state of job $1.
print_state() {
    _d=$JOBS/$1
    if [ ! -d "$_d" ]; then
        printf 'id=%s phase=unknown\n' "$1"
        return 0
    fi
    check_lost "$_d"
    _line="id=$1"
    _reason=
    _tmo=0
    [ -f "$_d/timed_out" ] && _tmo=1
    if [ -s "$_d/exit" ]; then
        get_line "$_d/exit"
        _code=${_got%%[!0-9]*}
        _line="$_line phase=exited exit_code=${_code:-255} timed_out=$_tmo"
    elif [ -f "$_d/unstartable" ]; then
        get "$_d/unstartable"
        _reason=$_got
        _line="$_line phase=unstartable"
    elif [ -f "$_d/lost" ]; then
        get "$_d/lost"
        _reason=$_got
        _line="$_line phase=exited timed_out=$_tmo"
    else
        _line="$_line phase=running timed_out=$_tmo"
    fi
    if get_line "$_d/started_at" && is_num "$_got"; then _line="$_line started_at=$_got"; fi
    if get_line "$_d/finished_at" && is_num "$_got"; then _line="$_line finished_at=$_got"; fi
    if [ -n "$_reason" ]; then
        printf '%s reason=%s\n' "$_line" "$(pct "$_reason")"
    else
        printf '%s\n' "$_line"
    fi
}

# Poll job $1 for up to $2 seconds: every 0.01 s for the first 0.1 s (most jobs of a turn
# end within milliseconds), every 0.05 s up to 0.6 s, every 0.1 s up to 1.6 s, then 0.2 s.
wait_done() {
    _wd=$JOBS/$1
    _left=$(hundredths "$2")
    _round=0
    while [ -d "$_wd" ] && ! is_done "$_wd" && [ "$_left" -gt 0 ]; do
        if ! frac_sleep; then
            _step=100
        elif [ "$_round" -lt 10 ]; then
            _step=1
        elif [ "$_round" -lt 20 ]; then
            _step=5
        elif [ "$_round" -lt 30 ]; then
            _step=10
        else
            _step=20
        fi
        [ "$_step" -le "$_left" ] || _step=$_left
        nap "$((_step / 100)).$((_step / 10 % 10))$((_step % 10))"
        _left=$((_left - _step))
        _round=$((_round + 1))
        [ $((_round % 20)) -eq 0 ] && check_lost "$_wd"
    done
}

# ------------------------------------------------------------------------------ verbs

# Parse the options of `start` (all of "$@"); the job's environment into $_jobenv, as shell
# text that exports it.
start_opts() {
    _user='' _timeout='' _kill_after='' _cwd='' _output='' _shell=bash _wait=0 _cmd='' _upto='' _upbytes='' _jobenv=''
    _opt=
    _ncmd=-1
    for _a in "$@"; do
        if [ "$_ncmd" -ge 0 ]; then
            _cmd=$_a
            _ncmd=$((_ncmd + 1))
            continue
        fi
        if [ -z "$_opt" ]; then
            case $_a in
                --) _ncmd=0 ;;
                --user | --timeout | --kill-after | --cwd | --output | --shell | --env | --wait | --tail | --then-read | \
                    --then-exclude | --then-download | --clear | --upload-to | --upload-bytes)
                    _opt=$_a ;;
                *) usage "start: unknown option: $_a" ;;
            esac
            continue
        fi
        case $_opt in
            --user)
                case $_a in '' | *:* | *"$NL"*) usage "start: invalid user: $_a" ;; esac
                _user=$_a
                ;;
            --timeout) is_num "$_a" || usage "start: --timeout wants seconds: $_a"; _timeout=$_a ;;
            --kill-after) is_num "$_a" || usage "start: --kill-after wants seconds: $_a"; _kill_after=$_a ;;
            --cwd) _cwd=$_a ;;
            --output) _output=$_a ;;
            --shell) case $_a in bash | sh) _shell=$_a ;; *) usage "start: --shell wants bash or sh: $_a" ;; esac ;;
            --env)
                case $_a in *=*) ;; *) usage "start: --env wants NAME=VALUE: $_a" ;; esac
                case ${_a%%=*} in '' | [0-9]* | *[!A-Za-z0-9_]* | _EO_*) usage "start: invalid variable name: ${_a%%=*}" ;; esac
                quote "${_a#*=}"
                _jobenv="${_jobenv}export ${_a%%=*}=$_quoted$NL"
                ;;
            --wait) is_num "$_a" || usage "start: --wait wants seconds: $_a"; _wait=$_a ;;
            --tail) case $_a in '' | *[!0-9]*) usage "start: --tail wants bytes: $_a" ;; esac ;;
            --then-read | --then-exclude | --then-download | --clear) ;;
            --upload-to) [ -n "$_a" ] || usage 'start: empty --upload-to'; _upto=$_a ;;
            --upload-bytes) case $_a in '' | *[!0-9]*) usage "start: --upload-bytes wants bytes: $_a" ;; esac; _upbytes=$_a ;;
        esac
        _opt=
    done
    [ -z "$_opt" ] || usage "start: $_opt needs a value"
    [ "$_ncmd" -eq 1 ] || usage 'start ID [OPTIONS] -- COMMAND (exactly one command argument)'
    # No default of its own: the operator always says how long a timed-out job has (runtime/timing.py).
    [ -n "$_kill_after" ] || usage 'start: --kill-after is required'
    { [ -n "$_upto" ] && [ -n "$_upbytes" ]; } || { [ -z "$_upto" ] && [ -z "$_upbytes" ]; } ||
        usage 'start: --upload-to and --upload-bytes go together'
}

# Clear the --clear paths among the options of `start` ("$@"), in their order.
start_clears() {
    _opt=
    for _a in "$@"; do
        if [ -z "$_opt" ]; then
            [ "$_a" = -- ] && return 0
            _opt=$_a
            continue
        fi
        if [ "$_opt" = --clear ]; then
            case $_a in
                # A folder sealed for this job's user (its test.sh writes the rewards there); a user
                # that does not exist leaves it root's: the job itself is then unstartable, as always.
                *:@job:/*)
                    _so=$_user
                    if [ -n "$_so" ] && ! pw_lookup "$_so"; then case $_so in *[!0-9]*) _so= ;; esac; fi
                    clear_path "${_a%%:*}:${_so}:${_a#*:@job:}"
                    ;;
                *) clear_path "$_a" ;;
            esac
        fi
        _opt=
    done
}

cmd_start() {
    [ $# -ge 1 ] || usage 'start ID [OPTIONS] -- COMMAND'
    _id=$1
    shift
    check_id "$_id"
    start_opts "$@"
    _d=$JOBS/$_id
    [ -d "$JOBS" ] || mkdir -p "$JOBS" 2>/dev/null
    if [ -n "$_upto" ]; then
        # The job's inputs, placed only by the exec that starts it: a retry or a restarted
        # operator re-attaching to the job never changes them under it.
        if [ -d "$_d" ]; then
            head -c "$_upbytes" >/dev/null
        else
            start_clears "$@"
            upload_archive "$_upto" "$_upbytes"
        fi
    fi
    if mkdir "$_d" 2>/dev/null; then
        # Empty: its modification time is when the job was created (check_lost).
        : >"$_d/created" || die "start: cannot write in $_d"
        container_key
        default_workdir
        case $_cwd in
            '') _cwd=$_wdir ;;
            /*) ;;
            *) _cwd=${_wdir%/}/$_cwd ;;
        esac
        case $_output in
            '') _output=$_d/output ;;
            /*) ;;
            *) _output=${_cwd%/}/$_output ;;
        esac
        # The spec reaches the runner in its environment (launch_runner); only where the output goes
        # is kept, for the output verb.
        write "$_d/output_path" "$_output" || die "start: cannot record the job in $_d"
        launch_runner "$_id"
    elif [ ! -d "$_d" ]; then
        die "start: cannot create $_d"
    fi
    [ "$_wait" = 0 ] || wait_done "$_id" "$_wait"
    print_state "$_id"
    print_extras "$_id" "$@"
}

# Once job $1 is done, what the options in "$2..." ask for after its state line, in their
# order: --tail N (the last N bytes of its output, as "tail <length>" and the bytes),
# --then-read PATH (a read frame) and --then-download PATH (a tar of PATH as `download`
# writes it, excluding the --then-exclude patterns given since the previous download, as
# "download <length>" and the bytes, or "download -1" when tar failed). Saves the operator
# an exec for each.
print_extras() {
    _xd=$JOBS/$1
    shift
    is_done "$_xd" || return 0
    _xexs=
    _xopt=
    for _xa in "$@"; do
        [ "$_xa" = -- ] && break
        case $_xopt in
            --tail)
                if own_output_size "$_xd" "$_xa" && [ "$_own" -eq 0 ]; then
                    printf 'tail 0\n' # nothing of its own (most short jobs): no copy to make
                else
                    read_scratch
                    own_output "$_xd" "$_xa" >"$_tmp" 2>/dev/null || : >"$_tmp"
                    printf 'tail %s\n' "$(($(wc -c <"$_tmp")))"
                    cat "$_tmp"
                fi
                ;;
            --then-read) read_scratch; read_frame "$_xa" ;;
            --then-exclude)
                quote "$_xa"
                _xexs="$_xexs --exclude $_quoted"
                ;;
            --then-download)
                read_scratch
                quote "$_xa"
                # A subshell: download's failure exits it, not us.
                if (eval "cmd_download $_xexs -- $_quoted") >"$_tmp" 2>/dev/null; then
                    printf 'download %s\n' "$(($(wc -c <"$_tmp")))"
                    cat "$_tmp"
                else
                    printf 'download -1\n'
                fi
                _xexs=
                ;;
        esac
        case $_xa in --tail | --then-read | --then-exclude | --then-download) _xopt=$_xa ;; *) _xopt= ;; esac
    done
}

# Start the runner of job $1 detached: its own session, stdio away from the exec's streams
# (an exec ends only when every holder of its stdout has closed it). The job's spec rides in
# the runner's environment (_EO_*), so that the runner reads no file back; its environment
# too, which is thus never written to disk (only root and the exec's user can read a
# process's environment, as they could the files).
launch_runner() {
    _log=$JOBS/$1/supervisor.log
    export _EO_SPEC=1 _EO_CMD="$_cmd" _EO_SHELL="$_shell" _EO_CWD="$_cwd" _EO_OUT="$_output" _EO_KA="$_kill_after" \
        _EO_TMO="$_timeout" _EO_USER="$_user" _EO_ENV="$_jobenv" _EO_MN="$_mn"
    if has setsid && setsid_forks; then
        # Not `&`: a non-interactive shell's background commands ignore SIGINT and SIGQUIT,
        # and a job must see them as docker exec would.
        setsid -f sh "$SELF" _run "$1" fg </dev/null >>"$_log" 2>&1
    elif has setsid; then
        setsid sh "$SELF" _run "$1" bg </dev/null >>"$_log" 2>&1 &
    else
        sh "$SELF" _run "$1" bg </dev/null >>"$_log" 2>&1 &
    fi
    unset _EO_SPEC _EO_CMD _EO_SHELL _EO_CWD _EO_OUT _EO_KA _EO_TMO _EO_USER _EO_ENV _EO_MN
}

# $1 quoted for the shell, into $_quoted: 'text', each ' as '\''. Builtins only.
quote() {
    _qs=$1
    _quoted=
    while :; do
        case $_qs in
            *"$SQ"*)
                _quoted=$_quoted${_qs%%"$SQ"*}$SQ\\$SQ$SQ
                _qs=${_qs#*"$SQ"}
                ;;
            *)
                _quoted=$SQ$_quoted$_qs$SQ
                return 0
                ;;
        esac
    done
}

# Does this container's setsid take -f (--fork)? Asked once per container.
setsid_forks() {
    _sfc=
    [ -z "${_mn-}" ] || _sfc=$BASE/setsid-fork.$_mn
    if [ -n "$_sfc" ] && get_line "$_sfc"; then
        [ "$_got" = 1 ]
        return
    fi
    _sfa=0
    case $(setsid --help 2>&1) in *--fork*) _sfa=1 ;; esac
    [ -z "$_sfc" ] || put "$_sfc" "$_sfa"
    [ "$_sfa" = 1 ]
}

# The runner: one per job, alive for the job's main process. $2: fg|bg (how it was started).
cmd_run() {
    _id=$1
    _how=${2:-fg}
    _d=$JOBS/$_id
    [ -d "$_d" ] || exit 1
    # The spec comes from the start exec (launch_runner) and nowhere else: a runner started any other
    # way runs nothing, and its job is found lost (check_lost).
    [ -n "${_EO_SPEC-}" ] || exit 1
    _cmd=$_EO_CMD _shell=$_EO_SHELL _cwd=$_EO_CWD _out=$_EO_OUT _ka=$_EO_KA _timeout=$_EO_TMO _user=$_EO_USER
    _jobenv=$_EO_ENV _mn=$_EO_MN
    unset _EO_SPEC _EO_CMD _EO_SHELL _EO_CWD _EO_OUT _EO_KA _EO_TMO _EO_USER _EO_ENV _EO_MN
    _stat=
    { IFS= read -r _stat </proc/$$/stat; } 2>/dev/null
    pid_space
    # shellcheck disable=SC2086 # fields after "pid (comm) ": starttime is the 20th
    [ -n "$_stat" ] && set -- ${_stat##*) } && write "$_d/runner" "$$ ${20} $_pns"
    [ -f "$_d/runner" ] || write "$_d/runner" "$$"

    # Every program the job's launch runs is resolved now: the job's environment (its PATH,
    # IFS, ...) is applied only in the subshells that exec it, never in the runner.
    find_prog "$_shell" || unstartable "shell not found: $_shell"
    _sp=$_fp
    find_prog sh && _shbin=$_fp

    # How to become the user. Every tool here keeps the environment it is given.
    _tool=none
    if [ -n "$_user" ]; then
        if pw_lookup "$_user"; then
            :
        else
            case $_user in
                *[!0-9]*) unstartable "no such user: $_user" ;;
                *) PW_NAME='' PW_UID=$_user PW_GID=0 PW_HOME=/ ;; # as docker: gid 0, HOME /
            esac
        fi
        if setpriv_switches; then
            _tool=setpriv
        elif [ -n "$PW_NAME" ] && has runuser; then
            _tool=runuser
        elif [ -n "$PW_NAME" ] && has su; then
            _tool=su
        elif [ -z "$PW_NAME" ]; then
            unstartable "cannot switch to uid $_user (no passwd entry) without util-linux setpriv"
        else
            unstartable "cannot switch to user $_user: none of setpriv, runuser, su"
        fi
        find_prog "$_tool" && _toolbin=$_fp
    fi
    case $_tool in
        none) set -- "$_sp" -c ;;
        setpriv)
            if [ -n "$PW_NAME" ]; then _groups=--init-groups; else _groups=--clear-groups; fi
            set -- "$_toolbin" --reuid="$PW_UID" --regid="$PW_GID" "$_groups" -- "$_sp" -c
            ;;
        runuser) set -- "$_toolbin" -m -u "$PW_NAME" -- "$_sp" -c ;;
        su)
            # util-linux su -c runs the command in a new session, out of reach of a TERM
            # to the job's process group; --session-command keeps it in ours.
            _suc=-c
            case $("$_toolbin" --help 2>&1) in *--session-command*) _suc=--session-command ;; esac
            set -- "$_toolbin" -m -s "$_sp" "$PW_NAME" "$_suc"
            ;;
    esac

    # Preflight as the job's user: the switch works, the shell runs, the directory is usable.
    # (Without a switch, root's shell and directory were checked above and below.)
    cd / || true
    _perr=$_d/preflight.err
    # shellcheck disable=SC2016 # expanded by the preflight shell
    if [ "$_tool" != none ] && ! (job_env && export EPISODE_OPERATOR_CWD="$_cwd" &&
        exec "$@" 'cd "$EPISODE_OPERATOR_CWD"') </dev/null >"$_perr" 2>&1; then
        get "$_perr"
        _msg=${_got%%"$NL"*}
        unstartable "cannot start ${_user:+as user $_user }in $_cwd: ${_msg:-the user switch or the shell failed}"
    fi
    cd "$_cwd" 2>/dev/null || unstartable "cannot enter $_cwd"
    _odir=${_out%/*}
    [ -z "$_odir" ] || [ -d "$_odir" ] || mkdir -p "$_odir" 2>/dev/null
    { : >>"$_out"; } 2>/dev/null || unstartable "cannot open the output file $_out"
    # Where this job's own output begins: `output` and --tail return only what follows.
    _osz=0
    if [ -s "$_out" ]; then
        _osz=$(wc -c <"$_out" 2>/dev/null) || unstartable "cannot read the output file $_out"
    fi
    write "$_d/output_offset" "$((_osz))"

    # Job-control-less background shells ignore SIGINT/SIGQUIT, and so does a runner whose
    # ancestors did (an exec's process need not start with default dispositions): reset them
    # where env can. Read with builtins, so the usual case (nothing ignored) forks nothing.
    _ign=0
    if [ "$_how" != bg ]; then
        while IFS=' 	' read -r _k _v; do
            case $_k in SigIgn:) _ign=${_v#"${_v%?}"} && break ;; esac
        done </proc/$$/status 2>/dev/null
    fi
    case $_how.$_ign in
        bg.* | *.[2-7a-f]) _ignored=1 ;;
        *) _ignored= ;;
    esac
    if [ -n "$_ignored" ] && case $(env --help 2>&1) in *default-signal*) true ;; *) false ;; esac; then
        find_prog env && set -- "$_fp" --default-signal=INT,QUIT "$@"
    fi
    # The wrapper that records the job's pid (kept through exec); in its own session and
    # process group when setsid exists, so that TERM and KILL reach all of the job.
    # shellcheck disable=SC2016 # expanded by the wrapper shell
    set -- "$_shbin" -c 'printf "%s\n" "$$" >"$0" && exec "$@"' "$_d/jobpid" "$@" "$_cmd"
    if find_prog setsid; then
        set -- "$_fp" "$@"
        write "$_d/grouped" 1
    fi

    write "$_d/started_at" "$(now)"
    [ -z "$_timeout" ] || watchdog </dev/null >/dev/null 2>&1 &
    # The job runs in the foreground of the runner: a background command of a shell without
    # job control would start with SIGINT and SIGQUIT ignored, unlike under docker exec.
    (job_env && exec "$@") </dev/null >>"$_out" 2>&1
    _rc=$?
    # The watchdog sees `exit` and leaves; after a timeout it still owes the KILL to
    # whatever ignored TERM.
    write "$_d/finished_at" "$(now)"
    write "$_d/exit" "$_rc"
    exit 0
}

# In a subshell about to exec the job (or its preflight): export the job's environment, over
# the runner's (the start exec's, the container's). Its text only exports checked names
# (start_opts), so no job variable can clobber the runner's (_EO_* are reserved).
job_env() {
    if [ -n "$_user" ]; then
        export HOME="${PW_HOME:-/}"
        if [ -n "$PW_NAME" ]; then
            export USER="$PW_NAME" LOGNAME="$PW_NAME"
        else
            unset USER LOGNAME
        fi
    fi
    eval "$_jobenv"
}

# The bound of a job (in the runner, as a background subshell): TERM its process group at
# the timeout, KILL it kill_after seconds later. It sleeps in steps of at most a second and
# leaves once the job is done: a single long sleep would outlive a short job (killing it
# from the runner races with starting it).
watchdog() {
    _left=$(hundredths "$_timeout")
    while [ "$_left" -gt 0 ]; do
        is_done "$_d" && exit 0
        if [ "$_left" -ge 100 ]; then
            sleep 1
            _left=$((_left - 100))
        else
            nap "0.$((_left / 10))$((_left % 10))"
            _left=0
        fi
    done
    is_done "$_d" && exit 0
    : >"$_d/timed_out"
    # The job's pid is written by its wrapper: wait a little if it has not been yet.
    _n=0
    while ! _tg=$(job_target "$_d"); do
        _n=$((_n + 1))
        [ "$_n" -le 20 ] || exit 0
        nap 0.1
    done
    kill -TERM "$_tg" 2>/dev/null
    nap "$_ka"
    kill -KILL "$_tg" 2>/dev/null
    exit 0
}

# End the runner: the job cannot start, for reason $1.
unstartable() {
    put "$_d/finished_at" "$(now)"
    put "$_d/unstartable" "$1"
    exit 0
}

cmd_wait() {
    [ $# -ge 2 ] || usage 'wait ID SECONDS [--tail N] [--then-read PATH]... [[--then-exclude PATTERN]... --then-download PATH]...'
    check_id "$1"
    is_num "$2" || usage "wait: SECONDS must be a number: $2"
    wait_done "$1" "$2"
    print_state "$1"
    _wid=$1
    shift 2
    _xo=
    for _xa in "$@"; do
        [ "$_xo" = --tail ] && case $_xa in '' | *[!0-9]*) usage "wait: --tail wants bytes: $_xa" ;; esac
        _xo=$_xa
    done
    print_extras "$_wid" "$@"
}

cmd_output() {
    [ $# -eq 2 ] || usage 'output ID BYTES'
    check_id "$1"
    case $2 in '' | *[!0-9]*) usage "output: BYTES must be a whole number: $2" ;; esac
    [ -d "$JOBS/$1" ] || die "output: no such job: $1"
    [ -f "$JOBS/$1/output_path" ] || die "output: job $1 has no recorded output path"
    own_output "$JOBS/$1" "$2" || die "output: cannot read the output of job $1"
}

# The last $2 bytes of what the job in directory $1 wrote to its output file: only what came
# after the size the file had when the job started (output_offset), since jobs may share one
# file (the oracle's /logs/agent/oracle.txt gets every turn's solve.sh). A file smaller than
# that was truncated or replaced since the job started: all of it is the job's.
own_output() {
    own_output_size "$1" "$2" || return 1
    [ "$_own" -gt 0 ] || return 0
    tail -c "$_own" "$_of"
}

# How many bytes own_output "$1" "$2" writes, into $_own (and the file into $_of): forks
# only when the output file is not empty.
own_output_size() {
    _own=0
    get "$1/output_path" || return 1
    _of=$_got
    [ -s "$_of" ] && [ "$2" -gt 0 ] || return 0
    _off=0
    if get_line "$1/output_offset"; then case $_got in '' | *[!0-9]*) ;; *) _off=$_got ;; esac; fi
    _osz=$(($(wc -c <"$_of"))) || return 1
    [ "$_osz" -ge "$_off" ] || _off=0
    _own=$((_osz - _off))
    [ "$_own" -le "$2" ] || _own=$2
}

cmd_probe() {
    printf 'version=%s\n' "$SUPERVISOR_VERSION"
    printf 'workdir=%s\n' "$(pct "$PWD")"
    _uid=$(id -u 2>/dev/null)
    if [ -z "$_uid" ]; then
        while read -r _k _v _rest; do
            [ "$_k" = Uid: ] && _uid=$_v && break
        done </proc/self/status
    fi
    _un=$(id -un 2>/dev/null) || _un=$_uid
    printf 'user=%s\nuid=%s\n' "$(pct "$_un")" "$_uid"
    for _t in bash timeout tar gzip find setsid runuser setpriv su head; do
        if has "$_t"; then printf 'has_%s=1\n' "$_t"; else printf 'has_%s=0\n' "$_t"; fi
    done
    tar_flavor
    printf 'tar=%s\n' "$_tf"
    # Which users jobs can become: named users (setpriv, runuser or su), bare uids (setpriv).
    _sw=0 _swu=0
    if setpriv_switches; then
        _sw=1 _swu=1
    elif has runuser || has su; then
        _sw=1
    fi
    printf 'can_switch_user=%s\ncan_switch_uid=%s\n' "$_sw" "$_swu"
}

# Placement's second half: the sandbox's layout folders ("$@", made when missing: mode 0777, as
# Harbor makes them for the agent; one that exists is left alone, sealed or not), then the exec's
# working directory (the container's) recorded for jobs.
cmd_place() {
    for _lf in "$@"; do
        [ -d "$_lf" ] || { mkdir -p -- "$_lf" && chmod 0777 "$_lf"; } || die "place: cannot create $_lf"
    done
    mkdir -p "$JOBS" "$TMPD" || die "place: cannot create $JOBS"
    # The pod's volume comes world-writable: as root, keep its records out of other users' reach
    # (a job's user could otherwise swap the whole folder, or pre-create a job's record). tmp/ is
    # only traversable: a replayed RUN's script is staged there for its (maybe non-root) user.
    if [ "$(id -u 2>/dev/null)" = 0 ]; then
        { chown 0:0 "$BASE" "$JOBS" "$TMPD" && chmod 0755 "$BASE" && chmod 0700 "$JOBS" && chmod 0711 "$TMPD"; } ||
            die "place: cannot make $BASE root's"
    fi
    put "$BASE/workdir" "$PWD" || die "place: cannot write $BASE/workdir"
    container_key
    [ -z "$_mn" ] || put "$BASE/workdir.$_mn" "$PWD" || die "place: cannot write $BASE/workdir.$_mn"
    cmd_probe
}

cmd_upload() {
    # Leading --clear PATH options: clear those first, in the same exec (e.g. /solution/).
    while [ "${1-}" = --clear ]; do
        [ $# -ge 2 ] || usage 'upload: --clear needs a path'
        clear_path "$2"
        shift 2
    done
    [ $# -eq 2 ] || usage 'upload [--clear PATH]... DEST BYTES'
    case $2 in '' | *[!0-9]*) usage "upload: BYTES must be a whole number: $2" ;; esac
    [ -n "$1" ] || usage 'upload: empty DEST'
    upload_archive "$1" "$2"
}

# Extract the tar of exactly $2 bytes on stdin into $1 (see upload in supervisor.py).
upload_archive() {
    _dest=$1
    has tar || die 'upload: no tar in this container'
    [ -d "$_dest" ] || mkdir -p "$_dest" 2>/dev/null || die "upload: cannot create $_dest"
    [ -d "$TMPD" ] || mkdir -p "$TMPD" || die "upload: cannot create $TMPD"
    _tmp=$TMPD/upload.$$
    trap 'rm -f "$_tmp" "$_tmp.dirs" "$_tmp.err"' EXIT
    # Exactly BYTES: stdin of an exec cannot be half-closed, so reading to EOF would hang.
    head -c "$2" >"$_tmp" || die 'upload: cannot read the archive from stdin'
    _got=$(($(wc -c <"$_tmp")))
    [ "$_got" -eq "$2" ] || die "upload: got $_got of $2 bytes"
    tar_flavor
    if [ "$_tf" = gnu ]; then
        tar -x -p --no-same-owner --no-overwrite-dir -f "$_tmp" -C "$_dest" 2>"$_tmp.err" ||
            die "upload: tar failed: $(cat "$_tmp.err")"
        rm -f "$_tmp" "$_tmp.err"
        trap - EXIT
        return 0
    fi
    # Other tars (busybox) reset existing directories to the archive's mode: note each
    # existing directory the archive names, and give it back its mode and owner afterwards.
    : >"$_tmp.dirs"
    tar -tvf "$_tmp" 2>/dev/null | while read -r _perm _own _size _date _time _name; do
        case $_perm in d*) ;; *) continue ;; esac
        _name=${_name%/}
        _p=${_dest%/}/$_name
        if [ -d "$_p" ] && [ ! -L "$_p" ]; then
            _meta=$(stat -c '%a %u %g' "$_p" 2>/dev/null) && printf '%s %s\n' "$_meta" "$_p"
        fi
    done >"$_tmp.dirs"
    tar -x -o -f "$_tmp" -C "$_dest" 2>"$_tmp.err" || die "upload: tar failed: $(cat "$_tmp.err")"
    while read -r _m _u _g _p; do
        chown "$_u:$_g" "$_p" 2>/dev/null
        chmod "$_m" "$_p" 2>/dev/null
    done <"$_tmp.dirs"
    rm -f "$_tmp" "$_tmp.dirs" "$_tmp.err"
    trap - EXIT
    return 0
}

cmd_download() {
    _n=$#
    _mode=opt
    _nex=0
    _nfound=0
    tar_flavor
    _flavor=$_tf
    [ -n "$_flavor" ] || die 'download: no tar in this container'
    for _a in "$@"; do
        case $_mode in
            opt)
                case $_a in
                    --exclude) _mode=excl ;;
                    --) _mode=paths ;;
                    *) usage 'download [--exclude PATTERN]... -- PATH...' ;;
                esac
                ;;
            excl)
                set -- "$@" "--exclude=$_a"
                _nex=$((_nex + 1))
                _mode=opt
                ;;
            paths)
                case $_a in /*) ;; *) usage "download: not an absolute path: $_a" ;; esac
                [ -e "$_a" ] || [ -L "$_a" ] || continue
                _rel=${_a#"${_a%%[!/]*}"}
                case $_rel in
                    '') _rel=. ;;
                    -*) if [ "$_flavor" = gnu ]; then _rel=--add-file=$_rel; else _rel=./$_rel; fi ;;
                esac
                set -- "$@" "$_rel"
                _nfound=$((_nfound + 1))
                ;;
        esac
    done
    [ "$_mode" = paths ] || usage 'download [--exclude PATTERN]... -- PATH...'
    shift "$_n"
    if [ "$_nex" -gt 0 ] && [ "$_flavor" != gnu ]; then
        case $(tar --help 2>&1) in *exclude*) ;; *) die "download: this tar ($_flavor) cannot exclude" ;; esac
    fi
    if [ "$_nfound" -eq 0 ]; then
        # tar refuses to write an empty archive: the end-of-archive marker alone.
        head -c 1024 /dev/zero
        return 0
    fi
    if [ "$_flavor" = gnu ]; then
        # Files that change or vanish while read (a running agent's logs) are not failures. Holes
        # stay holes (--sparse): a huge sparse file costs neither the pod's disk (an answer is
        # copied to tmp/ first) nor the wire, and the operator refuses it by its size.
        tar -c -f - -C / --sparse --ignore-failed-read --warning=no-file-changed --warning=no-file-removed \
            --warning=no-file-shrank "$@"
        _rc=$?
        [ "$_rc" -le 1 ] || die "download: tar failed with status $_rc"
    else
        tar -c -f - -C / "$@" || die 'download: tar failed'
    fi
}

# Frame one file on stdout: "<length> <percent-encoded path> <mtime>" and its bytes, or
# "-1 <path>" when it is not a readable regular file.
read_frame() {
    _rp=$1
    # A copy, so the length in the header is that of the bytes that follow it.
    if [ -f "$_rp" ] && cat "$_rp" >"$_tmp" 2>/dev/null; then
        # The modification time lets the operator refuse a reward file changed after test.sh;
        # the copy's size, in the same stat, is the length of the bytes that follow.
        _rs=$(stat -c '%s %.9Y' "$_tmp" "$_rp" 2>/dev/null) || _rs=
        _len=${_rs%% *} _mt=${_rs##* }
        case $_rs in *"$NL"*) ;; *) _len='' _mt='' ;; esac
        case $_len in '' | *[!0-9]*) _len=$(($(wc -c <"$_tmp"))) ;; esac
        # busybox's stat has no %.9Y: whole seconds then
        case $_mt in '' | *[!0-9.]*) _mt=$(stat -c %Y "$_rp" 2>/dev/null || echo -) ;; esac
        printf '%s %s %s\n' "$_len" "$(pct "$_rp")" "$_mt"
        cat "$_tmp" || die "read: cannot copy $_rp"
    else
        printf '%s %s\n' -1 "$(pct "$_rp")"
    fi
}

read_scratch() {
    [ -d "$TMPD" ] || mkdir -p "$TMPD" || die "read: cannot create $TMPD"
    _tmp=$TMPD/read.$$
    trap 'rm -f "$_tmp"' EXIT
}

cmd_read() {
    [ "${1-}" = -- ] && shift
    read_scratch
    for _p in "$@"; do
        read_frame "$_p"
    done
}

# Remove everything in directory $1, dotfiles included.
empty_dir() {
    if has find; then
        find "$1" -mindepth 1 -delete 2>/dev/null && return 0
    fi
    rm -rf -- "${1:?}"/* "$1"/.[!.]* "$1"/..?* 2>/dev/null
    [ -z "$(ls -A -- "$1" 2>/dev/null)" ]
}

# Clear $1: PATH, or MODE:OWNER:PATH for a directory sealed for a verifier — root's, mode MODE,
# before it is emptied (from then on no other user can add to it or rename it away, nor to or
# from the folders above it, which are made not writable by others), then given to OWNER (a
# user name or uid; empty: root; @job, in a start's --clear: the job's user). Sealing needs
# root: as another user (an image whose USER is not root) the folder is only cleared.
clear_path() {
    case $1 in
        /*) ;;
        *:*:/*)
            _sm=${1%%:*}
            _so=${1#*:}
            _so=${_so%%:*}
            _sp=${1#*:*:}
            case $_sm in '' | *[!0-7]*) usage "clear: invalid mode in $1" ;; esac
            seal_path "$_sm" "$_so" "$_sp"
            return
            ;;
        *) usage "clear: not an absolute path: $1" ;;
    esac
    _p=$1
    _q=$_p
    _dir=0
    case $_p in */) _dir=1 ;; esac
    while :; do case $_q in */) _q=${_q%/} ;; *) break ;; esac; done
    [ -n "$_q" ] || die "clear: refusing to clear /"
    if [ -L "$_q" ] || { [ -e "$_q" ] && [ ! -d "$_q" ]; }; then
        rm -f -- "$_q" || die "clear: cannot remove $_q"
        if [ "$_dir" = 1 ]; then
            { mkdir -p -- "$_q" && chmod 0777 "$_q"; } || die "clear: cannot create $_q"
        fi
    elif [ -d "$_q" ]; then
        empty_dir "$_q" || die "clear: cannot empty $_q"
        chmod 0777 "$_q" || die "clear: cannot chmod $_q"
    elif [ "$_dir" = 1 ]; then
        { mkdir -p -- "$_q" && chmod 0777 "$_q"; } || die "clear: cannot create $_q"
    fi
}

seal_path() {
    if [ "$(id -u 2>/dev/null)" != 0 ]; then
        clear_path "$3"
        return
    fi
    case $2 in @job) usage "clear: @job only in a start's --clear" ;; esac
    _q=$3
    while :; do case $_q in */) _q=${_q%/} ;; *) break ;; esac; done
    [ -n "$_q" ] || die "clear: refusing to clear /"
    _up=${_q%/*}
    while [ -n "$_up" ]; do
        # Whoever may write in a folder above could rename the sealed one away and put its own in its
        # place: those are made root's and not writable by others, unless sticky (as /tmp: there only
        # an entry's owner, root, may rename it).
        if [ -d "$_up" ] && [ ! -L "$_up" ]; then
            _st=$(stat -c '%u %a' "$_up") || die "clear: cannot read $_up"
            if [ "${_st%% *}" != 0 ]; then chown 0:0 "$_up" || die "clear: cannot seal $_up"; fi
            case ${_st#* } in
                *[2367][0-7] | *[0-7][2367]) [ -k "$_up" ] || chmod go-w "$_up" || die "clear: cannot seal $_up" ;;
            esac
        fi
        _up=${_up%/*}
    done
    if [ -L "$_q" ] || { [ -e "$_q" ] && [ ! -d "$_q" ]; }; then
        rm -f -- "$_q" || die "clear: cannot remove $_q"
    fi
    mkdir -p -- "$_q" || die "clear: cannot create $_q"
    { chown 0:0 "$_q" && chmod "$1" "$_q"; } || die "clear: cannot seal $_q"
    empty_dir "$_q" || die "clear: cannot empty $_q"
    if [ -n "$2" ]; then
        _err=$(chown -- "$2" "$_q" 2>&1) || die "clear: $_err"
    fi
}

cmd_clear() {
    [ "${1-}" = -- ] && shift
    for _p in "$@"; do
        clear_path "$_p"
    done
}

cmd_chown_workdir() {
    [ $# -eq 2 ] || usage 'chown-workdir USER DIR'
    _u=$1
    _dir=$2
    if [ -z "$_dir" ]; then
        default_workdir
        _dir=$_wdir
    fi
    case $_u in
        '') usage 'chown-workdir: empty USER' ;;
        *[!0-9]*) pw_lookup "$_u" || die "chown-workdir: no such user: $_u" ;;
    esac
    mkdir -p -- "$_dir" 2>/dev/null || die "chown-workdir: cannot create $_dir"
    _err=$(chown -- "$_u" "$_dir" 2>&1) || die "chown-workdir: $_err"
}

# Arguments too long for an exec URL come on stdin: a first line of decimal byte lengths,
# then the arguments' bytes back to back (BYTES in all). REST more bytes after them are the
# verb's own stdin (an upload's archive): read here too, since busybox head reads ahead.
argv_from_stdin() {
    case ${1-} in '' | *[!0-9]*) usage '--argv-stdin BYTES [REST]' ;; esac
    case ${2-0} in '' | *[!0-9]*) usage '--argv-stdin BYTES [REST]' ;; esac
    _rest=${2-0}
    mkdir -p "$TMPD" || die "cannot create $TMPD"
    _af=$TMPD/argv.$$
    trap 'rm -f "$_af" "$_af.rest"' EXIT
    head -c "$(($1 + _rest))" >"$_af" || die 'cannot read the arguments from stdin'
    [ "$(($(wc -c <"$_af")))" -eq "$(($1 + _rest))" ] || die 'short read of the arguments'
    IFS= read -r _lens <"$_af"
    _off=$((${#_lens} + 2))
    _all=$1
    set --
    for _len in $_lens; do
        case $_len in *[!0-9]*) die 'malformed argument lengths' 2 ;; esac
        _v=$(tail -c +"$_off" "$_af" | head -c "$_len"; echo x)
        set -- "$@" "${_v%x}"
        _off=$((_off + _len))
    done
    if [ "$_rest" -gt 0 ]; then
        tail -c +"$((_all + 1))" "$_af" >"$_af.rest" || die 'cannot read the arguments from stdin'
        # The verb reads the rest as its stdin; unlinked now, the open file stays readable.
        exec <"$_af.rest"
    fi
    rm -f "$_af" "$_af.rest"
    trap - EXIT
    main "$@"
}

# One exec, many calls (supervisor.py's session): requests on stdin, answers on stdout, so that a
# call costs a round trip on an open stream instead of an exec. A request is a header line
# "NONCE LINES BYTES", LINES lines of shell words (the verb and its arguments, quoted), and BYTES
# bytes for the verb's stdin; its answer is the verb's stdout, then "\n@@EO NONCE STATUS ERRBYTES\n"
# and the verb's stderr. Each verb runs in a subshell (its exit ends it, not the session), its
# stdin from a copy of the bytes read here with `head -c` (GNU head reads no further; the ready
# line says whether this container's does, and the operator sends bytes only where it does).
# Ends at the end of its stdin.
cmd_serve() {
    [ -d "$TMPD" ] || mkdir -p "$TMPD" || die "serve: cannot create $TMPD"
    _sv_in=$TMPD/serve.$$.in
    _sv_err=$TMPD/serve.$$.err
    trap 'rm -f "$_sv_in" "$_sv_err"' EXIT
    _sv_head=other
    case $(head --version 2>&1) in *'GNU coreutils'*) _sv_head=exact ;; esac
    printf '@@EO ready %s %s\n' "$SUPERVISOR_VERSION" "$_sv_head"
    while IFS=' ' read -r _sv_nonce _sv_lines _sv_bytes _sv_rest; do
        case $_sv_nonce in '' | *[!A-Za-z0-9]*) die "serve: malformed request header" 2 ;; esac
        case $_sv_lines$_sv_rest in '' | *[!0-9]*) die "serve: malformed request header" 2 ;; esac
        case $_sv_bytes in '' | *[!0-9]*) die "serve: malformed request header" 2 ;; esac
        _sv_text=
        _sv_sep=
        while [ "$_sv_lines" -gt 0 ]; do
            IFS= read -r _sv_line || die "serve: the request of $_sv_nonce ends early"
            _sv_text=$_sv_text$_sv_sep$_sv_line
            _sv_sep=$NL
            _sv_lines=$((_sv_lines - 1))
        done
        _sv_src=/dev/null
        if [ "$_sv_bytes" -gt 0 ]; then
            head -c "$_sv_bytes" >"$_sv_in" || die "serve: cannot read the stdin of $_sv_nonce"
            _sv_src=$_sv_in
        fi
        # The words are quoted by the operator (supervisor.py), so eval splits them back as sent.
        (eval "set -- $_sv_text" && main "$@") <"$_sv_src" 2>"$_sv_err"
        _sv_status=$?
        _sv_errbytes=0
        [ -s "$_sv_err" ] && _sv_errbytes=$(($(wc -c <"$_sv_err")))
        printf '\n@@EO %s %s %s\n' "$_sv_nonce" "$_sv_status" "$_sv_errbytes"
        [ "$_sv_errbytes" -eq 0 ] || cat "$_sv_err"
    done
}

main() {
    [ $# -ge 1 ] || usage 'supervisor.sh VERB ...'
    _verb=$1
    shift
    case $_verb in
        start) cmd_start "$@" ;;
        wait) cmd_wait "$@" ;;
        output) cmd_output "$@" ;;
        place) cmd_place "$@" ;;
        upload) cmd_upload "$@" ;;
        download) cmd_download "$@" ;;
        read) cmd_read "$@" ;;
        clear) cmd_clear "$@" ;;
        chown-workdir) cmd_chown_workdir "$@" ;;
        _run) cmd_run "$@" ;;
        --argv-stdin) argv_from_stdin "$@" ;;
        serve) cmd_serve "$@" ;;
        *) usage "unknown verb: $_verb" ;;
    esac
}

main "$@"
