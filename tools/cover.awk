# cover.awk reads a Go cover profile written by several test binaries
# (go test -coverpkg over many packages repeats each block once per binary)
# and prints each package's statement coverage, a block counting as covered
# when any binary ran it. Packages named in the floor variable (a
# space-separated list) must reach 80%, or it exits 1.
NR > 1 {
	split($1, at, ":")
	pkg = at[1]
	sub("/[^/]*$", "", pkg)
	if (!($1 in stmts)) { stmts[$1] = $2; owner[$1] = pkg }
	if ($3 > 0) hit[$1] = 1
}
END {
	for (b in stmts) {
		all[owner[b]] += stmts[b]
		total += stmts[b]
		if (b in hit) { ran[owner[b]] += stmts[b]; covered += stmts[b] }
	}
	n = split(floor, want, " ")
	bad = 0
	for (i = 1; i <= n; i++) {
		p = want[i]
		if (!(p in all)) { printf "%s: no statements in the profile\n", p; bad = 1; continue }
		pct = 100 * ran[p] / all[p]
		short = p; sub("^github.com/twill-net/twill/", "", short)
		printf "%-30s %5.1f%% of statements, unit tier (no root)\n", short "/", pct
		if (pct < 80) { printf "%s is below the 80%% floor\n", short; bad = 1 }
	}
	printf "%-30s %5.1f%% of statements\n", "all of them", 100 * covered / total
	exit bad
}
