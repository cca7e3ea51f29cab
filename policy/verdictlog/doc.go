// Package verdictlog is twilld's verdict log: what the policy table's log
// rules send to NFLOG group policy.LogGroup, read over netlink in the
// node's network namespace, decoded, named (pods, the rule that decided)
// and kept.
//
// The kernel bounds what is logged: each pod chain logs at most
// policy.LogRate denied packets a second, and counts the others in a rule
// of their own (policy.UnloggedPrefix); allowed connections are logged
// only for the namespaces that ask, sampled and bounded. A slow reader
// never slows the data path: the kernel drops what the socket cannot
// take, and the log counts the gap in NFLOG's sequence numbers.
//
// Each record is a JSON line in twilld's log, at level VERDICT, and stays
// in a ring buffer that GET /verdicts serves (twillctl policy log).
package verdictlog
