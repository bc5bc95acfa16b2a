# per-thread CPU ticks of process $1 over the client run "$2..."
pid=$1; shift
snap() { for t in /proc/$pid/task/*; do echo "$(basename $t) $(cat $t/comm | tr ' ' _) $(awk '{print $14+$15}' $t/stat)"; done | sort; }
snap > /tmp/b31/s0; "$@" > /dev/null; snap > /tmp/b31/s1
join /tmp/b31/s0 /tmp/b31/s1 | awk '{d=$5-$3; if (d>0) print $1, $2, d/100 " s"}' | sort -k3 -n -r | head
