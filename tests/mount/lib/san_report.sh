# san_report.sh — sanitizer reports in a form a failing run can show, for
# both the mounted cases (common.sh: a daemon's reports under $T/san) and
# the runner (run_all.sh: a unit binary's). Sourced; defines:
#
#   SAN_REPORT_RE       a line that starts a report: TSan, ASan,
#                       LeakSanitizer, UBSan's `runtime error:`
#   san_files FILE...   the files that hold a report (none: returns 1)
#   san_show FILE...    the first file's first report (six frames a stack,
#                       at most 60 lines; a TSan message that is not a
#                       framed report, such as a failed mmap, as it is),
#                       then each report's summary line with its count

SAN_REPORT_RE='(WARNING|ERROR): ThreadSanitizer|ERROR: (AddressSanitizer|LeakSanitizer)|: runtime error: '

san_files() { grep -lsE "$SAN_REPORT_RE" "$@" 2>/dev/null; }

san_show() {
  local first=$1
  if grep -q '^==================$' "$first"; then
    awk '/^==================$/ { n++; next } n == 1 && !/^ *#([6-9]|[1-9][0-9])/ && !/^$/' "$first"
  elif grep -q ThreadSanitizer "$first"; then
    # Not a framed report (a failed mmap, a fatal CHECK): the lines from
    # the first match on, as they are.
    awk -v re="$SAN_REPORT_RE|ThreadSanitizer" '$0 ~ re { r = 1 } r' "$first"
  else
    # ASan: up to the shadow bytes, without a stack frame's list of objects
    # (but the one accessed); UBSan (in a stderr file): from its report on.
    awk '/^Shadow bytes around/ { exit }
         /: runtime error: / { r = 1 }
         /^ +\[[0-9]+, [0-9]+\) / && !/<==/ { next }
         (r || FILENAME !~ /stderr/) && !/^ *#([6-9]|[1-9][0-9])/ && !/^$/ && !/^=+$/' "$first"
  fi | head -n 60
  grep -hsE '^SUMMARY: [A-Za-z]+Sanitizer|: runtime error: ' "$@" | sort | uniq -c
}
