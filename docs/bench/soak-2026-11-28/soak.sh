#!/bin/bash
# Usage: BUILD=build OUT=dir soak.sh STEPS  (the default tiny shapes model, 2 ranks, ring 2)
# RSS of each rank every 5 s during a 2-rank run
${BUILD:-build}/mmsp-run -n 2 -- ${BUILD:-build}/mmsp train --ring 2 --tokens-per-rank 64 --attention-block 32 --warmup 1 --steps $1 > ${OUT:-.}/train.log 2>&1 &
l=$!
sleep 3
while kill -0 $l 2>/dev/null; do
  for p in $(ps -o pid= --ppid $l); do
    r=$(tr '\0' '\n' < /proc/$p/environ 2>/dev/null | grep -m1 "^RANK=" | cut -d= -f2)
    s=$(grep -o "step [0-9]* |" ${OUT:-.}/train.log | tail -1 | grep -o "[0-9]*")
    echo "$(date +%s) rank $r step $s rss_kb $(grep VmRSS /proc/$p/status | awk '{print $2}')"
  done
  sleep 5
done > ${OUT:-.}/rss.txt
