package chaos

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"strings"
)

// Network namespaces: one per master and per server, each with a veth pair
// whose host end sits on one bridge. Every name starts with "gdc" (bridge,
// veths) or "gdc-" (namespaces) so the harness never touches anything else;
// leftovers of a killed run are removed at start.

const (
	bridgeName = "gdcbr0"
	subnet     = "10.213.0" // a /24; the host's end of the bridge is .1
	hostIP     = subnet + ".1"
)

// Net places processes: in namespaces on a bridge (On), or all on the
// host's loopback.
type Net struct {
	On    bool
	nodes []string // namespace names created
	logf  func(format string, a ...any)
}

// netnsUsable reports whether namespaces can be made here, and if not, why.
func netnsUsable() (bool, string) {
	if os.Geteuid() != 0 {
		return false, "not root"
	}
	if _, err := exec.LookPath("ip"); err != nil {
		return false, "no ip(8)"
	}
	if _, err := exec.LookPath("nft"); err != nil {
		return false, "no nft(8)"
	}
	// Try everything the harness does, on a probe namespace.
	defer run("ip", "netns", "del", "gdc-probe")
	defer run("ip", "link", "del", "gdcprobe")
	for _, c := range [][]string{
		{"ip", "netns", "add", "gdc-probe"},
		{"ip", "link", "add", "gdcprobe", "type", "veth", "peer", "name", "gdcprobep"},
		{"ip", "link", "set", "gdcprobep", "netns", "gdc-probe"},
		{"ip", "netns", "exec", "gdc-probe", "nft", "add", "table", "inet", "gdcprobe"},
	} {
		if err := run(c[0], c[1:]...); err != nil {
			return false, err.Error()
		}
	}
	return true, ""
}

func run(name string, args ...string) error {
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, bytes.TrimSpace(out))
	}
	return nil
}

func runIn(stdin string, name string, args ...string) error {
	cmd := exec.Command(name, args...)
	cmd.Stdin = strings.NewReader(stdin)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, bytes.TrimSpace(out))
	}
	return nil
}

// cleanupMounts unmounts the tmpfs data dirs (mounted as gdc-<server>)
// that a killed run left behind.
func cleanupMounts() {
	b, err := os.ReadFile("/proc/mounts")
	if err != nil {
		return
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) > 2 && strings.HasPrefix(f[0], "gdc-") && f[2] == "tmpfs" {
			run("umount", "-l", f[1])
		}
	}
}

// natLoopback makes 127.0.0.1:port on the host reachable from every
// namespace at hostIP:port through the kernel's NAT (DNAT to loopback,
// SNAT to loopback so the server sees a local client). Unlike a relay in
// user space this keeps one TCP connection end to end: when a master's
// namespace is cut, PostgreSQL's keepalives to it go unanswered and the
// database ends its session, as it would across a real partition.
func (n *Net) natLoopback(port string) error {
	if err := os.WriteFile("/proc/sys/net/ipv4/conf/"+bridgeName+"/route_localnet", []byte("1"), 0o644); err != nil {
		return err
	}
	rules := fmt.Sprintf(`table ip gdcnat {
	chain pre { type nat hook prerouting priority -100; iifname "%s" ip daddr %s tcp dport %s dnat to 127.0.0.1:%s; }
	chain in { type nat hook input priority 100; ip saddr %s.0/24 ip daddr 127.0.0.1 tcp dport %s snat to 127.0.0.1; }
}
`, bridgeName, hostIP, port, port, subnet, port)
	return runIn(rules, "nft", "-f", "-")
}

// cleanupLeftovers removes namespaces named gdc-*, links named gdc* and
// the host's gdcnat table.
func cleanupLeftovers() {
	run("nft", "delete", "table", "ip", "gdcnat")
	out, _ := exec.Command("ip", "netns", "list").Output()
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) > 0 && strings.HasPrefix(f[0], "gdc-") {
			run("ip", "netns", "del", f[0])
		}
	}
	out, _ = exec.Command("ip", "-br", "link").Output()
	sc = bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) > 0 {
			name, _, _ := strings.Cut(f[0], "@")
			if strings.HasPrefix(name, "gdc") {
				run("ip", "link", "del", name)
			}
		}
	}
}

// setup creates the bridge.
func (n *Net) setup() error {
	if !n.On {
		return nil
	}
	cleanupLeftovers()
	for _, c := range [][]string{
		{"ip", "link", "add", bridgeName, "type", "bridge"},
		{"ip", "addr", "add", hostIP + "/24", "dev", bridgeName},
		{"ip", "link", "set", bridgeName, "up"},
	} {
		if err := run(c[0], c[1:]...); err != nil {
			return err
		}
	}
	return nil
}

// addNode creates namespace gdc-<name> with address subnet.<octet> and
// returns that address (127.0.0.1 without namespaces).
func (n *Net) addNode(name string, octet int) (string, error) {
	if !n.On {
		return "127.0.0.1", nil
	}
	ns, host, peer := "gdc-"+name, "gdc"+name, "gdc"+name+"p"
	ip := fmt.Sprintf("%s.%d", subnet, octet)
	for _, c := range [][]string{
		{"ip", "netns", "add", ns},
		{"ip", "link", "add", host, "type", "veth", "peer", "name", peer},
		{"ip", "link", "set", peer, "netns", ns},
		{"ip", "link", "set", host, "master", bridgeName, "up"},
		{"ip", "-n", ns, "link", "set", peer, "name", "eth0"},
		{"ip", "-n", ns, "addr", "add", ip + "/24", "dev", "eth0"},
		{"ip", "-n", ns, "link", "set", "eth0", "up"},
		{"ip", "-n", ns, "link", "set", "lo", "up"},
		{"ip", "-n", ns, "route", "add", "default", "via", hostIP},
	} {
		if err := run(c[0], c[1:]...); err != nil {
			return "", err
		}
	}
	n.nodes = append(n.nodes, ns)
	return ip, nil
}

// command returns the argv that runs bin with args in node's namespace.
func (n *Net) command(node string, bin string, args ...string) []string {
	if !n.On {
		return append([]string{bin}, args...)
	}
	return append([]string{"ip", "netns", "exec", "gdc-" + node, bin}, args...)
}

// cut drops every packet into and out of node except on loopback (a
// partition: nothing is refused, everything is silently lost).
func (n *Net) cut(node string) error {
	return n.rules(node, "drop")
}

// loss drops pct percent of the packets into and out of node, at random.
func (n *Net) loss(node string, pct int) error {
	return n.rules(node, fmt.Sprintf("numgen random mod 100 < %d drop", pct))
}

func (n *Net) rules(node, verdict string) error {
	ns := "gdc-" + node
	n.heal(node)
	rules := fmt.Sprintf(`table inet gdcfault {
	chain in { type filter hook input priority 0; policy accept; iif "lo" accept; %s; }
	chain out { type filter hook output priority 0; policy accept; oif "lo" accept; %s; }
}
`, verdict, verdict)
	return runIn(rules, "ip", "netns", "exec", ns, "nft", "-f", "-")
}

// heal removes node's fault rules.
func (n *Net) heal(node string) {
	run("ip", "netns", "exec", "gdc-"+node, "nft", "delete", "table", "inet", "gdcfault")
}

// teardown removes every namespace and the bridge.
func (n *Net) teardown() {
	if !n.On {
		return
	}
	for _, ns := range n.nodes {
		run("ip", "netns", "del", ns)
	}
	cleanupLeftovers()
}
