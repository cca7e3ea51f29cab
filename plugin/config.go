package plugin

import (
	"encoding/json"
	"fmt"
	"sort"
	"strings"

	"github.com/containernetworking/cni/pkg/types"

	"github.com/twill-net/twill/internal/strictjson"
	"github.com/twill-net/twill/nl"
	"github.com/twill-net/twill/plugin/hostport"
)

// Defaults.
const (
	DefaultSubnetFile = "/run/twill/subnet.env"
	DefaultDataDir    = "/var/lib/cni/networks"
)

// NetConf is the plugin's network configuration.
type NetConf struct {
	types.NetConf
	SubnetFile string `json:"subnetFile,omitempty"`
	DataDir    string `json:"dataDir,omitempty"`
	MTU        int    `json:"mtu,omitempty"`
	// ValidAttachments is injected by the runtime for GC.
	ValidAttachments []types.GCAttachment `json:"cni.dev/valid-attachments,omitempty"`
	// RuntimeConfig holds the runtime's values for the capabilities the
	// plugin declares in the conflist: portMappings (hostPort).
	RuntimeConfig json.RawMessage `json:"runtimeConfig,omitempty"`
	// PortMappings is RuntimeConfig's portMappings as given; HostPorts
	// the same, checked.
	PortMappings json.RawMessage `json:"-"`
	HostPorts    []hostport.Port `json:"-"`
	// hostPortsErr is what is wrong with RuntimeConfig.PortMappings: ADD
	// and CHECK fail with it; DEL, GC and STATUS, which must clean up
	// after an ADD it failed, do not read the mappings they cannot use.
	hostPortsErr error
}

// knownKeys are the keys the CNI spec or runtimes put in a plugin's
// configuration, plus the plugin's own.
var knownKeys = map[string]bool{
	"cniVersion": true, "cniVersions": true, "name": true, "type": true, "capabilities": true,
	"ipam": true, "dns": true, "args": true, "runtimeConfig": true, "prevResult": true,
	"cni.dev/valid-attachments": true, "cni.dev/attachments": true,
	"subnetFile": true, "dataDir": true, "mtu": true,
}

// ParseConf decodes the configuration and rejects keys the plugin does not
// know, naming them.
func ParseConf(data []byte) (*NetConf, error) {
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(data, &raw); err != nil {
		return nil, fmt.Errorf("twill: decoding network configuration: %w", err)
	}
	var unknown []string
	for k := range raw {
		if !knownKeys[k] {
			unknown = append(unknown, k)
		}
	}
	if len(unknown) > 0 {
		sort.Strings(unknown)
		return nil, fmt.Errorf("twill: network configuration: unknown key %q (the twill plugin accepts subnetFile, dataDir, mtu and ipam)", unknown[0])
	}
	// The keys the plugin reads as plain values, checked first so that a
	// wrong type is reported with the key and the value given.
	var typed struct {
		CNIVersion string `json:"cniVersion"`
		Name       string `json:"name"`
		Type       string `json:"type"`
		SubnetFile string `json:"subnetFile"`
		DataDir    string `json:"dataDir"`
		MTU        int    `json:"mtu"`
	}
	var others []string
	for k := range knownKeys {
		switch k {
		case "cniVersion", "name", "type", "subnetFile", "dataDir", "mtu":
		default:
			others = append(others, k)
		}
	}
	err := strictjson.Decode(data, &typed, "", others...)
	if err != nil {
		return nil, fmt.Errorf("twill: network configuration: %w", err)
	}
	c := &NetConf{}
	if err := json.Unmarshal(data, c); err != nil {
		return nil, fmt.Errorf("twill: decoding network configuration: %w", err)
	}
	if c.Name == "" {
		return nil, fmt.Errorf(`twill: network configuration: name "": must not be empty`)
	}
	if strings.ContainsAny(c.Name, "/\\") || c.Name == "." || c.Name == ".." {
		return nil, fmt.Errorf("twill: network configuration: name %q: must be usable as a directory name", c.Name)
	}
	if c.MTU < 0 || (c.MTU > 0 && (c.MTU < 576 || c.MTU > 65535)) {
		return nil, fmt.Errorf("twill: network configuration: mtu %d: must be between 576 and 65535", c.MTU)
	}
	if c.PortMappings, c.HostPorts, err = runtimeHostPorts(c.RuntimeConfig); err != nil {
		c.HostPorts, c.hostPortsErr = nil, fmt.Errorf("twill: network configuration: %w", err)
	}
	if c.SubnetFile == "" {
		c.SubnetFile = DefaultSubnetFile
	}
	if c.DataDir == "" {
		c.DataDir = DefaultDataDir
	}
	return c, nil
}

// runtimeHostPorts reads runtimeConfig.portMappings; the runtime's other
// values (for capabilities twill does not declare) are not read.
func runtimeHostPorts(rc json.RawMessage) (json.RawMessage, []hostport.Port, error) {
	if len(rc) == 0 || string(rc) == "null" {
		return nil, nil, nil
	}
	var values map[string]json.RawMessage
	if json.Unmarshal(rc, &values) != nil {
		return nil, nil, fmt.Errorf("runtimeConfig %q: must be a JSON object", strictjson.Shown(rc))
	}
	ports, err := hostport.Parse(values["portMappings"])
	return values["portMappings"], ports, err
}

// CheckIfName validates CNI_IFNAME as the kernel would, with a clearer error.
func CheckIfName(name string) error {
	switch {
	case name == "":
		return fmt.Errorf("twill: CNI_IFNAME is empty")
	case len(name) > 15:
		return fmt.Errorf("twill: CNI_IFNAME %q: longer than 15 characters", name)
	case name == "." || name == "..":
		return fmt.Errorf("twill: CNI_IFNAME %q: not a valid interface name", name)
	case strings.ContainsAny(name, "/: \t\n"):
		return fmt.Errorf("twill: CNI_IFNAME %q: must not contain '/', ':' or whitespace", name)
	}
	return nil
}

// HostVethName is the host end's name for an attachment: "tw" and 13 hex
// digits of a hash of the container ID and interface name.
func HostVethName(containerID, ifName string) string { return nl.PodLinkName(containerID, ifName) }

// LinkAlias tags the host end with its attachment.
func LinkAlias(network, containerID, ifName string) string {
	return nl.PodLinkAliasPrefix + network + "/" + containerID + "/" + ifName
}

// ParseLinkAlias is LinkAlias's inverse for one network.
func ParseLinkAlias(network, alias string) (types.GCAttachment, bool) {
	rest, ok := strings.CutPrefix(alias, nl.PodLinkAliasPrefix+network+"/")
	if !ok {
		return types.GCAttachment{}, false
	}
	i := strings.LastIndexByte(rest, '/')
	if i <= 0 {
		return types.GCAttachment{}, false
	}
	return types.GCAttachment{ContainerID: rest[:i], IfName: rest[i+1:]}, true
}
