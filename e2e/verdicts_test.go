package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/yaml"

	networkingv1 "k8s.io/api/networking/v1"

	"github.com/twill-net/twill/policy"
	"github.com/twill-net/twill/policy/clusterread"
	"github.com/twill-net/twill/policy/verdictlog"
)

// verdictPod is a pod of the verdict tests: a namespace behind a node,
// wired by the CNI plugin, and its Pod in the apiserver.
type verdictPod struct {
	key, netns string
	node       int
	ip         netip.Addr
}

// TestPolicyVerdicts: twillctl policy explain agrees with the kernel. On
// two nodes running twilld --network-policy against a real apiserver, 12
// pods in two namespaces and 21 NetworkPolicies (pod, namespace and IP
// block peers, numbered, named and ranged ports, ingress and egress,
// default denies), Explain's verdict for each of the 396 (pod pair, port)
// cases matches a real probe; each node's table agrees with what the
// apiserver's state compiles to; the denied probes are in the verdict log
// with both pods and the policies that isolate, and the allowed ones of
// the namespace annotated twill.io/log-allowed=true with the rule that
// let them through.
func TestPolicyVerdicts(t *testing.T) {
	beside(t)
	k := newKubeCluster(t, 2, "host-gw")
	for i, n := range k.topo.Nodes {
		k.createNode(n.Name, podCIDR(i).String(), n.Addr.Addr(), nil)
	}
	for i := range k.topo.Nodes {
		k.startKubeDaemon(i, "--network-policy", "--healthz-ip", "0.0.0.0")
	}
	for i := range k.topo.Nodes {
		waitFor(t, 30*time.Second, k.topo.Nodes[i].Name+"'s subnet.env", func() bool {
			_, err := os.Stat(k.subnetFile(i))
			return err == nil
		})
	}
	pods := verdictPods(t, k)
	applyVerdictPolicies(t, k, pods)
	cl := verdictCluster(t, k)
	waitTablesAgree(t, k, cl, pods)

	type probeCase struct {
		from, to verdictPod
		port     string
	}
	var cases []probeCase
	for _, from := range pods {
		for _, to := range pods {
			if from.key != to.key {
				for _, port := range []string{"80/tcp", "8080/tcp", "53/udp"} {
					cases = append(cases, probeCase{from, to, port})
				}
			}
		}
	}
	var mu sync.Mutex
	var allowed, wrong int
	var denied []probeCase
	forEach(len(cases), 24, func(i int) {
		c := cases[i]
		proto, port, _ := policy.ParsePort(c.port)
		a, err := cl.Explain(policy.Query{From: c.from.key, To: c.to.key, Proto: proto, Port: port})
		if err != nil {
			t.Errorf("explain %s -> %s %s: %v", c.from.key, c.to.key, c.port, err)
			return
		}
		got := probe(c.from.netns, c.to.ip, proto, port, time.Second)
		if got != a.Allowed { // once more, slower, before calling it a disagreement
			got = probe(c.from.netns, c.to.ip, proto, port, 3*time.Second)
		}
		mu.Lock()
		defer mu.Unlock()
		if got != a.Allowed {
			wrong++
			t.Errorf("explain and the kernel disagree: the probe got through: %v; explain says:\n%s", got, a)
		}
		if got {
			allowed++
		} else {
			denied = append(denied, c)
		}
	})
	t.Logf("explain agreed with a probe in %d of %d cases (%d allowed, %d denied) over 12 pods, 2 nodes and 21 policies",
		len(cases)-wrong, len(cases), allowed, len(denied))
	if allowed < 50 || len(denied) < 50 {
		t.Errorf("%d allowed and %d denied: the policies test too little of either", allowed, len(denied))
	}
	checkVerdictLog(t, k, pods)
	checkVerdictCLI(t, k, pods)
	t.Run("flood", func(t *testing.T) { verdictFlood(t, k, pods) })
}

// verdictPods makes 12 pods: in namespaces alpha and beta, three on each
// node, labelled app web, db and client; web names port 8080 http. Each
// answers on TCP 80 and 8080 and UDP 53.
func verdictPods(t *testing.T, k *kubeCluster) []verdictPod {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	api := k.api.AdminClient(t)
	for _, n := range []struct {
		name, team string
		ann        map[string]string
	}{{"alpha", "a", nil}, {"beta", "b", map[string]string{policy.LogAllowedAnnotation: "true"}}} {
		if _, err := api.Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: n.name,
			Labels: map[string]string{"team": n.team}, Annotations: n.ann}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, err := api.ServiceAccounts(n.name).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	var out []verdictPod
	apps := []string{"web", "db", "client"}
	for _, nsName := range []string{"alpha", "beta"} {
		for i := range 6 {
			node, app := i/3, apps[i%3]
			name := fmt.Sprintf("%s%d", nsName[:1], i)
			netns, ip := k.addPod(node, name)
			serve(t, netns)
			var ports []corev1.ContainerPort
			if app == "web" {
				ports = []corev1.ContainerPort{{Name: "http", ContainerPort: 8080}}
			}
			createPod(t, k, nsName, name, k.topo.Nodes[node].Name, ip, map[string]string{"app": app}, ports)
			out = append(out, verdictPod{key: nsName + "/" + name, netns: netns, node: node, ip: ip})
		}
	}
	return out
}

// createPod creates a running pod in the apiserver, as kubelet would
// report it: on node, at ip.
func createPod(tb testing.TB, k *kubeCluster, nsName, name, node string, ip netip.Addr, labels map[string]string, ports []corev1.ContainerPort) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	api := k.api.AdminClient(tb)
	no := false
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: nsName, Name: name, Labels: labels},
		Spec: corev1.PodSpec{NodeName: node, AutomountServiceAccountToken: &no,
			Containers: []corev1.Container{{Name: "c", Image: "stand-in.invalid/none", Ports: ports}}}}
	p, err := api.Pods(nsName).Create(ctx, p, metav1.CreateOptions{})
	if err != nil {
		tb.Fatal(err)
	}
	p.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip.String(), PodIPs: []corev1.PodIP{{IP: ip.String()}}}
	if _, err := api.Pods(nsName).UpdateStatus(ctx, p, metav1.UpdateOptions{}); err != nil {
		tb.Fatal(err)
	}
}

// applyPolicy creates a NetworkPolicy from its YAML (metadata and spec).
func applyPolicy(tb testing.TB, k *kubeCluster, doc string) {
	tb.Helper()
	var np networkingv1.NetworkPolicy
	if err := yaml.UnmarshalStrict([]byte(doc), &np); err != nil {
		tb.Fatalf("%v in\n%s", err, doc)
	}
	api, err := newPolicyAPI(k.api.Admin)
	if err != nil {
		tb.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := api.NetworkingV1().NetworkPolicies(np.Namespace).Create(ctx, &np, metav1.CreateOptions{}); err != nil {
		tb.Fatalf("creating %s/%s: %v", np.Namespace, np.Name, err)
	}
}

// serve answers, in netns, TCP on 80 and 8080 (accept, then close) and
// UDP on 53 (echo), until the test ends.
func serve(t testing.TB, netns string) {
	t.Helper()
	err := ns.WithNetNSPath("/var/run/netns/"+netns, func(ns.NetNS) error {
		for _, port := range []string{"80", "8080"} {
			ln, err := net.Listen("tcp", ":"+port)
			if err != nil {
				return err
			}
			t.Cleanup(func() { ln.Close() })
			go func() {
				for {
					c, err := ln.Accept()
					if err != nil {
						return
					}
					c.Close()
				}
			}()
		}
		pc, err := net.ListenPacket("udp", ":53")
		if err != nil {
			return err
		}
		t.Cleanup(func() { pc.Close() })
		go func() {
			buf := make([]byte, 1500)
			for {
				n, from, err := pc.ReadFrom(buf)
				if err != nil {
					return
				}
				_, _ = pc.WriteTo(buf[:n], from)
			}
		}()
		return nil
	})
	if err != nil {
		t.Fatalf("listening in %s: %v", netns, err)
	}
}

// probe says whether a connection (TCP) or an echo (UDP) from netns to
// ip:port gets through within d.
func probe(netns string, ip netip.Addr, proto uint8, port uint16, d time.Duration) bool {
	network := "tcp"
	if proto == unix.IPPROTO_UDP {
		network = "udp"
	}
	var c net.Conn
	err := ns.WithNetNSPath("/var/run/netns/"+netns, func(ns.NetNS) (err error) {
		c, err = net.DialTimeout(network, netip.AddrPortFrom(ip, port).String(), d)
		return err
	})
	if err != nil {
		return false
	}
	defer c.Close()
	if network == "tcp" {
		return true
	}
	_ = c.SetDeadline(time.Now().Add(d))
	if _, err := c.Write([]byte("probe")); err != nil {
		return false
	}
	buf := make([]byte, 16)
	n, err := c.Read(buf)
	return err == nil && string(buf[:n]) == "probe"
}

// forEach runs do(0..n-1), at most width at once.
func forEach(n, width int, do func(int)) {
	var wg sync.WaitGroup
	work := make(chan int)
	for range width {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				do(i)
			}
		}()
	}
	for i := range n {
		work <- i
	}
	close(work)
	wg.Wait()
}

// verdictCluster reads what Explain reads from the apiserver.
func verdictCluster(t *testing.T, k *kubeCluster) *policy.Cluster {
	t.Helper()
	cli, err := kubernetes.NewForConfig(k.api.Admin)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cl, err := clusterread.Read(ctx, cli)
	if err != nil {
		t.Fatal(err)
	}
	if len(cl.Policies) < 20 {
		t.Fatalf("%d policies in the apiserver, want 20 or more", len(cl.Policies))
	}
	return cl
}

// waitTablesAgree waits until each node's twilld serves, for every pod,
// the table the apiserver's state compiles to.
func waitTablesAgree(t *testing.T, k *kubeCluster, cl *policy.Cluster, pods []verdictPod) {
	t.Helper()
	q := "?"
	var keys, ips []string
	for _, p := range pods {
		keys, ips = append(keys, p.key), append(ips, p.ip.String())
		q += "pod=" + p.key + "&ip=" + p.ip.String() + "&"
	}
	for i, n := range k.topo.Nodes {
		want, _ := json.Marshal(cl.Compiled(n.Name).Subset(keys, ips))
		var got []byte
		waitFor(t, 60*time.Second, n.Name+"'s twilld table as the apiserver's state compiles", func() bool {
			_, body := nodeGet(t, n.NS, kubeHealthPort, policy.SubsetPath+q)
			var v policy.NodeView
			if json.Unmarshal([]byte(body), &v) != nil {
				return false
			}
			got, _ = json.Marshal(v.Ruleset)
			return string(got) == string(want) && len(v.Drifted) == 0 && v.DriftErr == ""
		})
		_ = i
	}
}

// records reads node i's verdict log.
func records(t *testing.T, k *kubeCluster, i int) []verdictlog.Record {
	t.Helper()
	_, body := nodeGet(t, k.topo.Nodes[i].NS, kubeHealthPort, "/verdicts")
	var out []verdictlog.Record
	for _, line := range strings.Split(strings.TrimSpace(body), "\n") {
		var r verdictlog.Record
		if err := json.Unmarshal([]byte(line), &r); err == nil && r.Seq != 0 {
			out = append(out, r)
		}
	}
	return out
}

// checkVerdictLog: a denied probe from alpha/a2 (client) to alpha/a1 (db,
// every ingress denied but from web on 8080) is in node1's log, naming
// both and the policies that isolate a1; an allowed connection between two
// beta pods (beta is annotated) names the rule that allowed it.
func checkVerdictLog(t *testing.T, k *kubeCluster, pods []verdictPod) {
	t.Helper()
	var denied, allowed *verdictlog.Record
	waitFor(t, 30*time.Second, "a denied and an allowed record in node1's verdict log", func() bool {
		for _, r := range records(t, k, 0) {
			switch {
			case r.Verdict == "denied" && r.SrcPod == "alpha/a2" && r.DstPod == "alpha/a1" && r.Port == 80 && r.Direction == "ingress":
				denied = &r
			case r.Verdict == "allowed" && r.SrcPod == "beta/b1" && r.DstPod == "beta/b0" && r.Direction == "ingress":
				allowed = &r
			}
		}
		return denied != nil && allowed != nil
	})
	if !strings.Contains(denied.Policy, "alpha/db-deny-all") || denied.Proto != "tcp" || denied.Node != k.topo.Nodes[0].Name {
		t.Errorf("denied record %+v: want alpha/db-deny-all named, tcp, on %s", denied, k.topo.Nodes[0].Name)
	}
	if !strings.Contains(allowed.Policy, "beta/allow-same-ns spec.ingress[0]") {
		t.Errorf("allowed record %+v: want beta/allow-same-ns spec.ingress[0] named", allowed)
	}
	for _, r := range records(t, k, 0) {
		if r.Verdict == "allowed" && !strings.HasPrefix(r.SrcPod, "beta/") && !strings.HasPrefix(r.DstPod, "beta/") {
			t.Errorf("an allowed connection logged for pods whose namespace did not ask: %+v", r)
			break
		}
	}
	t.Logf("denied: %+v\nallowed: %+v", *denied, *allowed)
}

// checkVerdictCLI runs twillctl as an operator does: policy log on the
// node, policy explain with the admin's kubeconfig (the node tables read
// through the apiserver's node proxy).
func checkVerdictCLI(t *testing.T, k *kubeCluster, pods []verdictPod) {
	t.Helper()
	out := runIn(t, k.topo.Nodes[0].NS, k.bin+"/twillctl", "policy", "log", "--endpoint", fmt.Sprintf("http://127.0.0.1:%d", kubeHealthPort), "--pod", "alpha/a1")
	if !strings.Contains(out, "denied ingress alpha/a2 (") || !strings.Contains(out, "-> alpha/a1 (") || !strings.Contains(out, "alpha/db-deny-all") {
		t.Errorf("twillctl policy log --pod alpha/a1 does not show a2's denied connection:\n%s", out)
	}
	kc, err := k.api.AdminKubeconfig()
	if err != nil {
		t.Fatal(err)
	}
	out = runIn(t, k.topo.Underlay, k.bin+"/twillctl", "policy", "explain", "--kubeconfig", kc, "--twilld-port", fmt.Sprint(kubeHealthPort),
		"--from", "alpha/a2", "--to", "alpha/a0", "--port", "80/tcp")
	if !contains(out, ": allowed", "allowed by alpha/web-from-clients spec.ingress[0]", "node "+k.topo.Nodes[0].Name+": its twilld's table agrees, and the kernel holds it") {
		t.Errorf("twillctl policy explain a2 -> a0 80/tcp:\n%s", out)
	}
	out = runIn(t, k.topo.Underlay, k.bin+"/twillctl", "policy", "explain", "--kubeconfig", kc, "--twilld-port", fmt.Sprint(kubeHealthPort),
		"--from", "alpha/a2", "--to", "alpha/a1", "--port", "80/tcp")
	if !contains(out, ": denied", `"deny ingress alpha/a1"`) {
		t.Errorf("twillctl policy explain a2 -> a1 80/tcp:\n%s", out)
	}
	t.Logf("twillctl policy explain:\n%s", out)
}

func runIn(t *testing.T, netns string, args ...string) string {
	t.Helper()
	out, err := execIn(netns, args...)
	if err != nil {
		t.Fatalf("%s in %s: %v\n%s", strings.Join(args, " "), netns, err, out)
	}
	return out
}

// applyVerdictPolicies creates the 21 NetworkPolicies of TestPolicyVerdicts.
func applyVerdictPolicies(t *testing.T, k *kubeCluster, pods []verdictPod) {
	t.Helper()
	var b3, a2 netip.Addr
	for _, p := range pods {
		switch p.key {
		case "beta/b3":
			b3 = p.ip
		case "alpha/a2":
			a2 = p.ip
		}
	}
	for _, d := range strings.Split(fmt.Sprintf(verdictPolicies, b3, podCIDR(0), a2), "\n---\n") {
		applyPolicy(t, k, d)
	}
}

const verdictPolicies = `metadata: {namespace: alpha, name: web-from-clients}
spec: {podSelector: {matchLabels: {app: web}}, ingress: [{from: [{podSelector: {matchLabels: {app: client}}}], ports: [{protocol: TCP, port: 80}]}]}
---
metadata: {namespace: alpha, name: web-named}
spec: {podSelector: {matchLabels: {app: web}}, ingress: [{from: [{namespaceSelector: {matchLabels: {team: b}}}], ports: [{port: http}]}]}
---
metadata: {namespace: alpha, name: db-deny-all}
spec: {podSelector: {matchLabels: {app: db}}, policyTypes: [Ingress]}
---
metadata: {namespace: alpha, name: db-from-web}
spec: {podSelector: {matchLabels: {app: db}}, ingress: [{from: [{podSelector: {matchLabels: {app: web}}}], ports: [{port: 8080}]}]}
---
metadata: {namespace: alpha, name: client-egress}
spec: {podSelector: {matchLabels: {app: client}}, policyTypes: [Egress], egress: [{to: [{podSelector: {matchLabels: {app: web}}}]}, {to: [{namespaceSelector: {matchLabels: {team: b}}}], ports: [{protocol: UDP, port: 53}]}, {to: [{podSelector: {matchLabels: {app: db}}}]}]}
---
metadata: {namespace: alpha, name: web-from-b3}
spec: {podSelector: {matchLabels: {app: web}}, ingress: [{from: [{ipBlock: {cidr: %[1]s/32}}], ports: [{protocol: TCP, port: 80}]}]}
---
metadata: {namespace: alpha, name: web-node1-but-a2}
spec: {podSelector: {matchLabels: {app: web}}, ingress: [{from: [{ipBlock: {cidr: %[2]s, except: [%[3]s/32]}}], ports: [{protocol: UDP, port: 53}]}]}
---
metadata: {namespace: alpha, name: db-range-from-beta}
spec: {podSelector: {matchLabels: {app: db}}, ingress: [{from: [{namespaceSelector: {matchLabels: {team: b}}}], ports: [{protocol: TCP, port: 70, endPort: 90}]}]}
---
metadata: {namespace: alpha, name: db-egress}
spec: {podSelector: {matchLabels: {app: db}}, policyTypes: [Egress], egress: [{ports: [{protocol: TCP, port: 50, endPort: 60}]}, {to: [{podSelector: {matchLabels: {app: web}}}], ports: [{protocol: TCP, port: 80}]}]}
---
metadata: {namespace: alpha, name: web-sctp}
spec: {podSelector: {matchLabels: {app: web}}, ingress: [{ports: [{protocol: SCTP, port: 80}]}]}
---
metadata: {namespace: alpha, name: client-no-ingress}
spec: {podSelector: {matchLabels: {app: client}}, ingress: []}
---
metadata: {namespace: alpha, name: all-from-beta-web}
spec: {podSelector: {}, ingress: [{from: [{namespaceSelector: {matchLabels: {team: b}}, podSelector: {matchLabels: {app: web}}}], ports: [{protocol: TCP, port: 80}]}]}
---
metadata: {namespace: beta, name: default-deny}
spec: {podSelector: {}, policyTypes: [Ingress]}
---
metadata: {namespace: beta, name: allow-same-ns}
spec: {podSelector: {}, ingress: [{from: [{podSelector: {}}]}]}
---
metadata: {namespace: beta, name: web-from-alpha-clients}
spec: {podSelector: {matchLabels: {app: web}}, ingress: [{from: [{namespaceSelector: {matchLabels: {team: a}}, podSelector: {matchLabels: {app: client}}}], ports: [{protocol: TCP, port: 80}]}]}
---
metadata: {namespace: beta, name: db-dns}
spec: {podSelector: {matchLabels: {app: db}}, ingress: [{from: [{namespaceSelector: {}}], ports: [{protocol: UDP, port: 53}]}]}
---
metadata: {namespace: beta, name: client-egress}
spec: {podSelector: {matchLabels: {app: client}}, policyTypes: [Egress], egress: [{to: [{podSelector: {matchLabels: {app: web}}}], ports: [{port: http}]}]}
---
metadata: {namespace: beta, name: client-dns}
spec: {podSelector: {matchLabels: {app: client}}, policyTypes: [Egress], egress: [{to: [{namespaceSelector: {}}], ports: [{protocol: UDP, port: 53}]}]}
---
metadata: {namespace: beta, name: web-8080-anyone}
spec: {podSelector: {matchLabels: {app: web}}, ingress: [{from: [{ipBlock: {cidr: 0.0.0.0/0}}], ports: [{protocol: TCP, port: 8080}]}]}
---
metadata: {namespace: beta, name: db-from-db}
spec: {podSelector: {matchLabels: {app: db}}, ingress: [{from: [{podSelector: {matchLabels: {app: db}}}]}]}
---
metadata: {namespace: beta, name: web-egress-all}
spec: {podSelector: {matchLabels: {app: web}}, policyTypes: [Egress], egress: [{}]}`
