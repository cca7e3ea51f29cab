package etcdflags

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	etcdsm "github.com/twill-net/twill/subnet/etcd"
)

// The password comes from the file's first line; a file that cannot be
// read, an empty one, or a password given both ways is refused, naming
// the flag.
func TestPasswordFile(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	for _, tc := range []struct {
		name string
		o    Options
		want string // the password, or the error's text
	}{
		{"first line", Options{PasswordFile: write("ok", "s3cret\nnot this\n")}, "s3cret"},
		{"CRLF", Options{PasswordFile: write("crlf", "s3cret\r\n")}, "s3cret"},
		{"no newline", Options{PasswordFile: write("bare", "s3cret")}, "s3cret"},
		{"flag alone", Options{ClientOptions: etcdsm.ClientOptions{Password: "flag"}}, "flag"},
		{"empty", Options{PasswordFile: write("empty", "\n")}, `--etcd-password-file "` + dir + `/empty": no password on its first line`},
		{"missing", Options{PasswordFile: dir + "/none"}, "--etcd-password-file: open " + dir + "/none: no such file or directory"},
		{"both", Options{ClientOptions: etcdsm.ClientOptions{Password: "flag"}, PasswordFile: dir + "/ok"}, `--etcd-password and --etcd-password-file "` + dir + `/ok" are both set: give one`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			co, err := tc.o.clientOptions()
			got := co.Password
			if err != nil {
				got = err.Error()
			}
			if got != tc.want {
				t.Errorf("got %q, want %q", got, tc.want)
			}
			if err != nil && strings.Contains(err.Error(), "s3cret") {
				t.Errorf("the error %q quotes the password", err)
			}
		})
	}
}
