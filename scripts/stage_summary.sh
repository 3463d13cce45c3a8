#!/usr/bin/env bash
# One line that says what a stage's log shows it ran (counts where the tool prints them).
stage=$1 log=$2
case $stage in
  pytest|integration|engine) grep -E '^=+ .*(passed|failed|error).* in [0-9.]+s' "$log" | tail -1 | tr -d '=' ;;
  units)    grep -E '^units: ' "$log" | tail -1 ;;
  sanity)   echo "$(grep -c '^Running sanity test' "$log") sanity tests run; $(grep -c '^ERROR' "$log") errors" ;;
  molecule*) grep -E '^molecule: ' "$log" | tail -1 ;;
  lint)     grep -E 'Passed|Failed' "$log" | tail -1 ;;
  build)    grep -E '^tarball ok' "$log" | tail -1 ;;
  argspecs) tail -1 "$log" ;;
  *)        tail -1 "$log" ;;
esac
