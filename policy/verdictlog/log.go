package verdictlog

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// LevelVerdict is the log level of verdict records: between INFO and
// WARN, named VERDICT.
const LevelVerdict = slog.Level(2)

// DefaultSize is how many records the ring keeps.
const DefaultSize = 4096

// Log reads the verdicts of one node and keeps the latest.
type Log struct {
	// Logger gets each record at LevelVerdict (JSONHandler makes them
	// JSON lines); errors go to it too.
	Logger *slog.Logger
	Node   string
	Namer  Namer
	Size   int // of the ring; DefaultSize when zero
	// NetNS, when set, is the network namespace to read (a file
	// descriptor); the calling thread's otherwise.
	NetNS int

	mu   sync.Mutex
	ring []Record // guarded by mu; ring[seq % size]
	next uint64   // guarded by mu: the next record's seq, from 1

	records  [2]atomic.Uint64 // denied, allowed
	lost     atomic.Uint64    // records the kernel dropped, or unreadable
	lastSeq  uint32           // NFLOG's sequence, read by the one reader
	seenSeq  bool
	received chan struct{} // closed and replaced on each record
}

// Add decodes one logged packet and keeps its record.
func (l *Log) Add(prefix string, packet []byte, at time.Time) {
	h, err := parseHeader(packet)
	if err != nil {
		l.lost.Add(1)
		l.Logger.Debug("unreadable verdict log record", "prefix", prefix, "err", err)
		return
	}
	r, err := record(l.Namer, l.Node, prefix, h, at)
	if err != nil {
		l.lost.Add(1)
		l.Logger.Debug("unreadable verdict log record", "err", err)
		return
	}
	if r.Verdict == "allowed" {
		l.records[1].Add(1)
	} else {
		l.records[0].Add(1)
	}
	l.mu.Lock()
	l.init()
	r.Seq = l.next
	l.ring[r.Seq%uint64(len(l.ring))] = r
	l.next++
	close(l.received)
	l.received = make(chan struct{})
	l.mu.Unlock()
	l.Logger.Log(context.Background(), LevelVerdict, "verdict", "seq", r.Seq, "verdict", r.Verdict, "direction", r.Direction,
		"src", r.Src, "dst", r.Dst, "srcPod", r.SrcPod, "dstPod", r.DstPod, "proto", r.Proto, "port", r.Port, "policy", r.Policy, "node", r.Node)
}

// Since returns the records after seq, oldest first, of the pod
// (namespace/name) when set, and the seq to ask from next.
func (l *Log) Since(seq uint64, pod string) ([]Record, uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.init()
	if seq >= l.next {
		seq = 0 // asked past the last record: twilld restarted since
	}
	size := uint64(len(l.ring))
	from := seq + 1
	if l.next > size && from < l.next-size {
		from = l.next - size
	}
	var out []Record
	for s := max(from, 1); s < l.next; s++ {
		r := l.ring[s%size]
		if pod == "" || r.SrcPod == pod || r.DstPod == pod {
			out = append(out, r)
		}
	}
	return out, max(seq, l.next-1)
}

// wait returns a channel closed at the next record.
func (l *Log) wait() <-chan struct{} {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.init()
	return l.received
}

// init makes the ring; l.mu is held.
func (l *Log) init() {
	if l.ring != nil {
		return
	}
	size := l.Size
	if size <= 0 {
		size = DefaultSize
	}
	l.ring, l.next, l.received = make([]Record, size), 1, make(chan struct{})
}

// ServeHTTP answers GET /verdicts?since=<seq>&pod=<ns/name>&wait=<duration>:
// the records after since as JSON lines, waiting up to wait (at most a
// minute) for one when there is none. The last line is not a record but
// {"next": <seq>}, the since of the next call.
func (l *Log) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	q := req.URL.Query()
	var since uint64
	if s := q.Get("since"); s != "" {
		var err error
		if since, err = strconv.ParseUint(s, 10, 64); err != nil {
			http.Error(w, fmt.Sprintf("since %q: want a record's seq", s), http.StatusBadRequest)
			return
		}
	}
	var wait time.Duration
	if s := q.Get("wait"); s != "" {
		var err error
		if wait, err = time.ParseDuration(s); err != nil || wait < 0 {
			http.Error(w, fmt.Sprintf("wait %q: want a duration such as 30s", s), http.StatusBadRequest)
			return
		}
		wait = min(wait, time.Minute)
	}
	pod := q.Get("pod")
	recs, next := l.Since(since, pod)
	deadline := time.After(wait)
	for len(recs) == 0 && wait > 0 {
		select {
		case <-l.wait():
		case <-deadline:
			wait = 0
		case <-req.Context().Done():
			return
		}
		recs, next = l.Since(since, pod)
	}
	w.Header().Set("Content-Type", "application/x-ndjson")
	enc := json.NewEncoder(w)
	for _, r := range recs {
		_ = enc.Encode(r)
	}
	_ = enc.Encode(map[string]uint64{"next": next})
}

var (
	recordsDesc = prometheus.NewDesc("twill_netpol_log_records_total", "Verdict log records read from the kernel, by verdict.", []string{"verdict"}, nil)
	lostDesc    = prometheus.NewDesc("twill_netpol_log_records_lost_total",
		"Verdict log records lost: dropped by the kernel because twilld read too slowly, or unreadable.", nil, nil)
)

// Describe implements prometheus.Collector.
func (l *Log) Describe(ch chan<- *prometheus.Desc) {
	ch <- recordsDesc
	ch <- lostDesc
}

// Collect implements prometheus.Collector.
func (l *Log) Collect(ch chan<- prometheus.Metric) {
	ch <- prometheus.MustNewConstMetric(recordsDesc, prometheus.CounterValue, float64(l.records[0].Load()), "denied")
	ch <- prometheus.MustNewConstMetric(recordsDesc, prometheus.CounterValue, float64(l.records[1].Load()), "allowed")
	ch <- prometheus.MustNewConstMetric(lostDesc, prometheus.CounterValue, float64(l.lost.Load()))
}
