package plugin

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/cni/pkg/types/create"
)

// Delegation to the configured IPAM plugin, as the CNI library's
// invoke.Delegate* run it: the plugin is found in CNI_PATH, and runs with
// this process's environment (CNI_COMMAND replaced), the network
// configuration on stdin, and its stderr passed through. twill does not
// link package invoke: it brings net/http, TLS and OpenTelemetry into the
// plugin, which cost 3.3 ms of every exec of it (ADD, DEL, CHECK) on the
// project's machine, measured with a program that only imports it.

// delegate runs the IPAM plugin ipamType for command on conf and returns
// what it printed.
func delegate(ctx context.Context, command, ipamType string, conf []byte) ([]byte, error) {
	path, err := findPlugin(ipamType, filepath.SplitList(os.Getenv("CNI_PATH")))
	if err != nil {
		return nil, err
	}
	env := []string{"CNI_COMMAND=" + command}
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "CNI_COMMAND=") {
			env = append(env, kv)
		}
	}
	// A plugin binary being replaced is busy for a moment (ETXTBSY): try
	// again, a few times.
	for try := 0; ; try++ {
		var stdout, stderr bytes.Buffer
		c := exec.CommandContext(ctx, path)
		c.Env, c.Stdin, c.Stdout, c.Stderr = env, bytes.NewReader(conf), &stdout, &stderr
		err := c.Run()
		if errors.Is(err, syscall.ETXTBSY) && try < 5 {
			time.Sleep(time.Second)
			continue
		}
		if err != nil {
			return nil, pluginError(err, stdout.Bytes(), stderr.Bytes())
		}
		_, _ = stderr.WriteTo(os.Stderr)
		return stdout.Bytes(), nil
	}
}

// findPlugin is the first regular file called name in dirs.
func findPlugin(name string, dirs []string) (string, error) {
	if name == "" || strings.ContainsRune(name, os.PathSeparator) || name == ".." {
		return "", fmt.Errorf("ipam.type %q: not a plugin name", name)
	}
	for _, d := range dirs {
		p := filepath.Join(d, name)
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() {
			return p, nil
		}
	}
	return "", fmt.Errorf("ipam.type %q: no such plugin in CNI_PATH %q", name, dirs)
}

// pluginError is the CNI error a failed plugin printed, or one made of
// what it said.
func pluginError(err error, stdout, stderr []byte) error {
	var e types.Error
	switch {
	case len(stdout) > 0 && json.Unmarshal(stdout, &e) == nil && (e.Code != 0 || e.Msg != ""):
		return &e
	case len(stdout) > 0:
		return &types.Error{Msg: fmt.Sprintf("failed, with output %q that is not a CNI error: %v", stdout, err)}
	case len(stderr) > 0:
		return &types.Error{Msg: fmt.Sprintf("failed: %q: %v", stderr, err)}
	}
	return &types.Error{Msg: fmt.Sprintf("failed with no error message: %v", err)}
}

// delegateAdd runs the IPAM plugin's ADD and reads its result, in the
// version it says (or, saying none, the configuration's).
func delegateAdd(ctx context.Context, ipamType string, conf []byte) (types.Result, error) {
	out, err := delegate(ctx, "ADD", ipamType, conf)
	if err != nil {
		return nil, err
	}
	var v struct {
		CNIVersion string `json:"cniVersion"`
	}
	if err := json.Unmarshal(out, &v); err != nil {
		return nil, fmt.Errorf("decoding its result: %w", err)
	}
	if v.CNIVersion == "" {
		if err := json.Unmarshal(conf, &v); err != nil {
			return nil, fmt.Errorf("decoding the configuration's cniVersion: %w", err)
		}
		var m map[string]any
		if err := json.Unmarshal(out, &m); err != nil {
			return nil, fmt.Errorf("decoding its result: %w", err)
		}
		m["cniVersion"] = v.CNIVersion
		if out, err = json.Marshal(m); err != nil {
			return nil, err
		}
	}
	return create.Create(v.CNIVersion, out)
}
