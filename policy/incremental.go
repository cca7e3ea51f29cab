package policy

import (
	"fmt"
	"maps"
	"net/netip"
	"reflect"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Compiler compiles one snapshot after another. When only pods changed
// since its last compile, it works out again the chains of the local pods
// that changed and the sets whose members changed, and keeps the rest:
// its result is Compile's (FuzzIncrementalIsFull), at a cost that grows
// with the change, but for a look at each pod object and each local pod.
// Anything else changed (a namespace, a policy's spec, a Node's labels or
// addresses, the node's CIDRs, the log settings), a problem in the last
// compile, or a pod entering or leaving a named port's peers, and it
// compiles the whole state, as Compile does.
//
// It reads objects as the informers keep them: a changed object is a new
// one, with a new ResourceVersion (a policy's spec, a new generation). An
// object without one is taken as changed every time.
type Compiler struct {
	last  *compiler // the last compile, its maps as the next one starts
	in    inputs    // what the last compile read besides pods
	pods  *podCache
	nodes map[*corev1.Node]nodeSeen
	// Incremental says whether the last Compile was one.
	Incremental bool
}

// deps is what a compile records for the next one to tell what a change
// of pods changes.
type deps struct {
	owner string // the policy being compiled
	// uses are the sets each policy made or read; compiledFor the
	// policies compiled for each local pod (the sets of those compiled for
	// no pod are not in the table); live counts those pods, by policy.
	uses        map[string]map[string]bool
	compiledFor map[string][]string
	live        map[string]int
	// sources are the matchers of the pods each set holds; named those of
	// the named ports' peers, whose sets, and so rules, come and go with
	// the pods.
	sources      map[string][]matcher
	named        map[string]namedSource
	clusterCache map[string][]peer // a ClusterNetworkPolicy rule's peers, by its sets' base name
	// clusterRules are a ClusterNetworkPolicy's rules in one direction
	// ("ClusterNetworkPolicy/name in"), when the same for every pod it
	// selects.
	clusterRules map[string][]tierRule
	// refs counts the live policies that use each set; was, during a
	// step, says of each policy it made live or not whether it was live
	// before.
	refs map[string]int
	was  map[string]bool
}

// namedSource is who a named port's sets hold: the pods that name one of
// names, of those from matches (or all).
type namedSource struct {
	names []string
	from  []matcher
	all   bool
}

func newDeps() deps {
	return deps{uses: map[string]map[string]bool{}, compiledFor: map[string][]string{}, live: map[string]int{},
		sources: map[string][]matcher{}, named: map[string]namedSource{}, clusterCache: map[string][]peer{}, clusterRules: map[string][]tierRule{},
		refs: map[string]int{}}
}

// use records that the policy being compiled made or read set name.
func (d *deps) use(name string) {
	if d.owner == "" || d.uses == nil {
		return
	}
	u := d.uses[d.owner]
	if u == nil {
		u = map[string]bool{}
		d.uses[d.owner] = u
	}
	u[name] = true
}

func (d *deps) usePeers(ps []peer) {
	for _, p := range ps {
		if p.addr.Set != "" {
			d.use(p.addr.Set)
		}
	}
}

func (d *deps) madeSet(name string, from []matcher) {
	d.use(name)
	if from != nil {
		d.sources[name] = from
	}
}

// namedFrom records the source of a named port's sets, by the rule and
// port that make them.
func (d *deps) namedFrom(rule string, names []string, from []matcher, all bool) {
	d.named[rule+" "+strings.Join(names, ",")] = namedSource{names: names, from: from, all: all}
}

// compiled records that policy was compiled for local pod key.
func (d *deps) compiled(key, policy string) {
	d.touch(policy)
	d.compiledFor[key] = append(d.compiledFor[key], policy)
	d.live[policy]++
}

func (d *deps) touch(policy string) {
	if _, ok := d.was[policy]; !ok && d.was != nil {
		d.was[policy] = d.live[policy] > 0
	}
}

// countRefs counts the sets' users afresh (a full compile).
func (d *deps) countRefs() {
	for pol := range d.live {
		for name := range d.uses[pol] {
			d.refs[name]++
		}
	}
}

// relive updates live, the sets the live policies use, for the policies
// a step made live or not: from store, every set made.
func (d *deps) relive(live, store map[string]Set) {
	for pol, was := range d.was {
		if now := d.live[pol] > 0; now != was {
			for name := range d.uses[pol] {
				if now {
					d.refs[name]++
					live[name] = store[name]
				} else if d.refs[name]--; d.refs[name] <= 0 {
					delete(d.refs, name)
					delete(live, name)
				}
			}
		}
	}
	d.was = nil
}

// forget drops what was compiled for local pod key.
func (d *deps) forget(key string) {
	for _, pol := range d.compiledFor[key] {
		d.touch(pol)
		if d.live[pol]--; d.live[pol] <= 0 {
			delete(d.live, pol)
		}
	}
	delete(d.compiledFor, key)
}

// Compile computes the policy table for the local pods of s.Node, as
// Compile does.
func (k *Compiler) Compile(s Snapshot) Result {
	if k.pods == nil {
		k.pods = &podCache{seen: map[*corev1.Pod]*seenPod{}}
	}
	in := k.inputsOf(s)
	c := k.pods.read(s)
	k.Incremental = false
	if k.last != nil && in.ok && k.in.equal(in) && len(k.last.problems) == 0 && k.step(c, s) {
		k.Incremental = true
	} else {
		c = k.pods.read(s) // a step that failed has written to c
		c.compile(s, true)
		c.store = maps.Clone(c.sets)
		c.countRefs()
	}
	r := c.result()
	k.last, k.in = c, in
	return r
}

// step compiles c incrementally from k.last, and says whether it could.
func (k *Compiler) step(c *compiler, s Snapshot) bool {
	last := k.last
	changes := changedPods(last.pods, c.pods)
	for _, ch := range changes {
		for _, src := range last.named {
			if src.has(last, ch.old) || src.has(c, ch.new) {
				return false // a named port's sets, and rules, may come or go
			}
		}
	}
	c.deps, c.deps.was = last.deps, map[string]bool{}
	c.peerCache, c.selectorCache, c.selectors = last.peerCache, last.selectorCache, last.selectors
	if sameObjects(s.ClusterPolicies, last.clusterIn) {
		c.clusterParsed = last.clusterParsed
	}
	// The compile writes the sets it makes to the store: every set made
	// since the last full compile, live or not.
	store := last.store
	c.sets = store
	refilled := c.refillChanged(last, changes, store)
	before := c.retarget(last, changes)
	c.compile(s, false) // the policies' problems, none, are the last compile's
	if len(c.problems) > 0 {
		return false
	}
	c.keepUnchanged(last, changes, before)
	c.store, c.sets = store, last.sets
	for _, name := range refilled {
		if _, ok := c.sets[name]; ok {
			c.sets[name] = store[name]
		}
	}
	c.relive(c.sets, store)
	return true
}

// refillChanged refills in store the sets whose matchers match a changed
// pod, before or after its change, and names them.
func (c *compiler) refillChanged(last *compiler, changes []podChange, store map[string]Set) []string {
	var refilled []string
	for name, from := range c.sources {
		if s, ok := store[name]; ok && slices.ContainsFunc(changes, func(ch podChange) bool {
			return anyMatches(from, last, ch.old) || anyMatches(from, c, ch.new)
		}) {
			store[name] = c.refillStep(s, from, last, changes)
			refilled = append(refilled, name)
		}
	}
	return refilled
}

// refillStep is refill's set, worked out from s and the changes alone:
// the addresses of the changed pods s held go, unless a pod that matches
// holds one still (an address a deleted pod's object still lists, given
// to a new pod); those of the changed pods that match come. Its cost grows
// with the set and the changes, not with the pods its selectors look at
// (refill's: every pod of the namespaces they match).
func (c *compiler) refillStep(s Set, from []matcher, last *compiler, changes []podChange) Set {
	var gone, come []netip.Addr
	for _, ch := range changes {
		if anyMatches(from, last, ch.old) {
			gone = append(gone, ch.old.ips...)
		}
		if anyMatches(from, c, ch.new) {
			come = append(come, ch.new.ips...)
		}
	}
	gone = slices.DeleteFunc(gone, func(ip netip.Addr) bool { return ip.Is6() != s.V6 || c.heldByMatching(ip, from) })
	come = slices.DeleteFunc(come, func(ip netip.Addr) bool { return ip.Is6() != s.V6 })
	if len(gone) == 0 && len(come) == 0 {
		return s
	}
	slices.SortFunc(come, netip.Addr.Compare)
	// Merged into a new array: the last compile's readers keep theirs.
	elems := make([]netip.Addr, 0, len(s.Elems)+len(come))
	add := func(ip netip.Addr) {
		if n := len(elems); n == 0 || elems[n-1] != ip {
			elems = append(elems, ip)
		}
	}
	for _, ip := range s.Elems {
		for len(come) > 0 && come[0].Compare(ip) < 0 {
			add(come[0])
			come = come[1:]
		}
		if !slices.Contains(gone, ip) {
			add(ip)
		}
	}
	for _, ip := range come {
		add(ip)
	}
	s.Elems = elems
	if len(elems) == 0 {
		s.Elems = nil // as Compile makes an empty set
	}
	return s
}

// heldByMatching says whether a pod that from matches holds ip now.
func (c *compiler) heldByMatching(ip netip.Addr, from []matcher) bool {
	for _, p := range c.pods {
		if slices.Contains(p.ips, ip) && anyMatches(from, c, p) {
			return true
		}
	}
	return false
}

// retarget forgets what was compiled for the local pods that changed,
// makes those that remain c's targets, and returns what selected each
// before (nil: nothing).
func (c *compiler) retarget(last *compiler, changes []podChange) map[string]*Selection {
	c.chains, c.selected = last.chains, last.selected
	c.shared, c.sharedOf = last.shared, last.sharedOf
	c.targets, c.targetsNS = nil, map[string][]*pod{}
	before := map[string]*Selection{}
	c.sharedBefore = map[string][2]string{}
	for _, ch := range changes {
		if ch.old != nil && ch.old.local {
			before[ch.old.key] = c.selected[ch.old.key]
			c.sharedBefore[ch.old.key] = c.sharedOf[ch.old.key]
			delete(c.chains, ch.old.key)
			delete(c.selected, ch.old.key)
			c.forget(ch.old.key)
			c.unshare(ch.old.key)
		}
		if ch.new != nil && ch.new.local {
			c.targets = append(c.targets, ch.new)
			c.targetsNS[ch.new.ns] = append(c.targetsNS[ch.new.ns], ch.new)
		}
	}
	return before
}

// keepUnchanged keeps the last compile's Selected map while no changed
// pod's selection changed; and its sets of every local pod while no
// local pod came, went, or changed its addresses or the directions it
// has a chain in.
func (c *compiler) keepUnchanged(last *compiler, changes []podChange, before map[string]*Selection) {
	sameSel, keep := true, slices.Equal(c.unmanagedAddrs(), last.unmanagedAddrs())
	for _, ch := range changes {
		var was, is *Selection
		if ch.old != nil {
			was = before[ch.old.key]
		}
		if ch.new != nil {
			is = c.selected[ch.new.key]
		}
		if (was == nil) != (is == nil) || was != nil && !reflect.DeepEqual(*was, *is) {
			sameSel = false
		}
		o, n := ch.old != nil && ch.old.local, ch.new != nil && ch.new.local
		if o != n || o && (!slices.Equal(ch.old.ips, ch.new.ips) || directions(was) != directions(is)) {
			keep = false
		}
		if o && n && sharing(c.sharedBefore[ch.old.key]) != c.sharesAdmin(ch.new.key) {
			keep = false // the rest maps change
		}
	}
	if sameSel {
		c.selectedOut = last.selectedOut
	}
	if keep {
		c.kept = last.globals
	}
}

// sharing says whether a pod goes to a shared Admin chain in egress and
// in ingress: whether it is in the rest maps.
func sharing(shared [2]string) [2]bool { return [2]bool{shared[0] != "", shared[1] != ""} }

// directions says whether s has the pod chains in egress and in ingress.
func directions(s *Selection) [2]bool {
	if s == nil {
		return [2]bool{}
	}
	return [2]bool{len(s.Egress)+len(s.ClusterEgress) > 0, len(s.Ingress)+len(s.ClusterIngress) > 0}
}

// sameObjects says whether a and b hold the same objects, in any order.
func sameObjects[T comparable](a, b []T) bool {
	if len(a) != len(b) {
		return false
	}
	in := make(map[T]bool, len(b))
	for _, x := range b {
		in[x] = true
	}
	return !slices.ContainsFunc(a, func(x T) bool { return !in[x] })
}

func anyMatches(ms []matcher, c *compiler, p *pod) bool {
	return p != nil && slices.ContainsFunc(ms, func(m matcher) bool { return m.matches(c, p) })
}

func (n namedSource) has(c *compiler, p *pod) bool {
	return p != nil && slices.ContainsFunc(n.names, func(name string) bool { return len(p.ports[name]) > 0 }) && (n.all || anyMatches(n.from, c, p))
}

// podChange is a pod that came (old nil), went (new nil) or changed.
type podChange struct{ old, new *pod }

// changedPods walks two pod lists sorted by key.
func changedPods(a, b []*pod) []podChange {
	var out []podChange
	i, j := 0, 0
	for i < len(a) || j < len(b) {
		switch {
		case j == len(b) || i < len(a) && a[i].key < b[j].key:
			out = append(out, podChange{old: a[i]})
			i++
		case i == len(a) || b[j].key < a[i].key:
			out = append(out, podChange{new: b[j]})
			j++
		default:
			if a[i] != b[j] && !samePod(a[i], b[j]) {
				out = append(out, podChange{a[i], b[j]})
			}
			i++
			j++
		}
	}
	return out
}

func samePod(a, b *pod) bool {
	return a.key == b.key && a.ns == b.ns && a.local == b.local && maps.Equal(a.labels, b.labels) && slices.Equal(a.ips, b.ips) &&
		maps.EqualFunc(a.ports, b.ports, slices.Equal)
}

// podCache keeps what podOf read of each pod object, by its
// ResourceVersion, and the order of the last read's pods and policies.
type podCache struct {
	seen      map[*corev1.Pod]*seenPod
	reads     uint64 // seenPod.read: the read that last saw it
	pods      []*pod // sorted by key
	gen       uint64
	policies  []*networkingv1.NetworkPolicy // sorted
	policySet map[*networkingv1.NetworkPolicy]bool
}

// sorted sorts ps by key: the pods of the last read in their order, the
// others sorted and merged in.
func (pc *podCache) sorted(ps []*pod) []*pod {
	if pc == nil {
		sortPods(ps)
		return ps
	}
	pc.gen += 2
	now, kept := pc.gen, pc.gen+1
	for _, p := range ps {
		p.mark = now
	}
	old := make([]*pod, 0, len(ps))
	for _, p := range pc.pods {
		if p.mark == now {
			old = append(old, p)
			p.mark = kept
		}
	}
	var fresh []*pod
	for _, p := range ps {
		if p.mark == now {
			fresh = append(fresh, p)
		}
	}
	sortPods(fresh)
	out := make([]*pod, 0, len(ps))
	for len(old) > 0 || len(fresh) > 0 {
		if len(fresh) == 0 || len(old) > 0 && old[0].key < fresh[0].key {
			out, old = append(out, old[0]), old[1:]
		} else {
			out, fresh = append(out, fresh[0]), fresh[1:]
		}
	}
	pc.pods = out
	return out
}

// sortedPolicies sorts ps by namespace/name, or returns the last read's
// when they are the same objects.
func (pc *podCache) sortedPolicies(ps []*networkingv1.NetworkPolicy) []*networkingv1.NetworkPolicy {
	if pc == nil {
		return sortPolicies(ps)
	}
	if len(ps) == len(pc.policies) && !slices.ContainsFunc(ps, func(p *networkingv1.NetworkPolicy) bool { return !pc.policySet[p] }) {
		return pc.policies
	}
	pc.policies = sortPolicies(ps)
	pc.policySet = make(map[*networkingv1.NetworkPolicy]bool, len(ps))
	for _, p := range ps {
		pc.policySet[p] = true
	}
	return pc.policies
}

type seenPod struct {
	rv, node string
	pod      *pod
	read     uint64
}

// read is newCompiler's, reading again only the pods that changed since
// the last read.
func (pc *podCache) read(s Snapshot) *compiler {
	pc.reads++
	c := newCompiler(s, pc)
	if len(pc.seen) > 2*len(s.Pods)+64 { // forget the objects no read sees
		maps.DeleteFunc(pc.seen, func(_ *corev1.Pod, e *seenPod) bool { return e.read != pc.reads })
	}
	return c
}

// podOf is podOf's, read again only when p changed.
func (pc *podCache) podOf(p *corev1.Pod, node string) *pod {
	if pc == nil {
		return podOf(p, node)
	}
	e, ok := pc.seen[p]
	if !ok || e.rv == "" || e.rv != p.ResourceVersion || e.node != node {
		e = &seenPod{rv: p.ResourceVersion, node: node, pod: podOf(p, node)}
		pc.seen[p] = e
	}
	e.read = pc.reads
	return e.pod
}

// inputs is what a compile reads besides pods: when it is the same, only
// pods changed.
type inputs struct {
	node                          string
	cidrs                         []netip.Prefix
	logDenied, logAllowed, logOff bool
	sample                        uint32
	versions                      map[string]string // kind/namespace/name → ResourceVersion
	nodes                         map[string]string // Node name → its labels and addresses
	ok                            bool              // every object has a ResourceVersion; no policy unread
}

func (a inputs) equal(b inputs) bool {
	return a.node == b.node && slices.Equal(a.cidrs, b.cidrs) && a.logDenied == b.logDenied && a.logAllowed == b.logAllowed &&
		a.logOff == b.logOff && a.sample == b.sample && maps.Equal(a.versions, b.versions) && maps.Equal(a.nodes, b.nodes)
}

func (k *Compiler) inputsOf(s Snapshot) inputs {
	in := inputs{node: s.Node, cidrs: s.LocalCIDRs, logDenied: s.LogDenied, logAllowed: s.LogAllowed, logOff: s.LogOff, sample: s.LogSample,
		versions: make(map[string]string, len(s.Namespaces)+len(s.Policies)+len(s.ClusterPolicies)), ok: len(s.ClusterPolicyErrors) == 0}
	add := func(key, rv string) {
		in.versions[key] = rv
		in.ok = in.ok && rv != ""
	}
	for _, n := range s.Namespaces {
		add("ns/"+n.Name, n.ResourceVersion)
	}
	for _, p := range s.Policies {
		add("np/"+p.Namespace+"/"+p.Name, specVersion(p.ObjectMeta))
	}
	for _, p := range s.ClusterPolicies {
		add("cnp/"+p.Name, specVersion(p.ObjectMeta))
	}
	if len(s.ClusterPolicies) > 0 { // a nodes peer reads them
		in.nodes = k.nodesOf(s.Nodes)
	}
	return in
}

// specVersion is what changes with a policy's spec: the object (its UID)
// and its generation, which its status and labels leave alone (twilld
// writes a ClusterNetworkPolicy's status); without them, its
// ResourceVersion.
func specVersion(m metav1.ObjectMeta) string {
	if m.UID == "" || m.Generation == 0 {
		return m.ResourceVersion
	}
	return fmt.Sprint(m.UID, "/", m.Generation)
}

// nodeSeen is what a Node's peer reads of it, by its ResourceVersion.
type nodeSeen struct{ rv, what string }

// nodesOf is what the nodes peers read of each Node: its labels and
// addresses (not its heartbeats).
func (k *Compiler) nodesOf(ns []*corev1.Node) map[string]string {
	next := make(map[*corev1.Node]nodeSeen, len(ns))
	out := make(map[string]string, len(ns))
	for _, n := range ns {
		e, ok := k.nodes[n]
		if !ok || e.rv == "" || e.rv != n.ResourceVersion {
			e = nodeSeen{rv: n.ResourceVersion, what: fmt.Sprint(n.Labels, n.Status.Addresses)}
		}
		next[n] = e
		out[n.Name] = e.what
	}
	k.nodes = next
	return out
}
