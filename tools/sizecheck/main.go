// Command sizecheck is part of make lint: it fails when a non-test function
// is over 80 lines, or a file in a package with a size limit is over it
// (backend/vxlan 300 lines, plugin 250). Long functions and god files are
// where the restructure of the kernel layer started; this keeps them out.
package main

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

const maxFuncLines = 80

// fileLimits caps the lines of every non-test file in a directory.
var fileLimits = map[string]int{
	"backend/vxlan": 300,
	"plugin":        250,
}

// skip holds trees that are not twill's own code.
var skip = []string{"build", "bin", ".git", "tools/kube", "tools/cri", "node_modules"}

func main() {
	var problems []string
	fset := token.NewFileSet()
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			for _, s := range skip {
				if path == s {
					return filepath.SkipDir
				}
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		if limit, ok := fileLimits[filepath.Dir(path)]; ok {
			if n := strings.Count(string(src), "\n"); n > limit {
				problems = append(problems, fmt.Sprintf("%s: %d lines, over the %d of %s", path, n, limit, filepath.Dir(path)))
			}
		}
		f, err := parser.ParseFile(fset, path, src, 0)
		if err != nil {
			return err
		}
		for _, decl := range f.Decls {
			fn, ok := decl.(*ast.FuncDecl)
			if !ok || fn.Body == nil {
				continue
			}
			start, end := fset.Position(fn.Pos()).Line, fset.Position(fn.End()).Line
			if n := end - start + 1; n > maxFuncLines {
				problems = append(problems, fmt.Sprintf("%s:%d: func %s is %d lines, over %d", path, start, fn.Name.Name, n, maxFuncLines))
			}
		}
		return nil
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "sizecheck:", err)
		os.Exit(2)
	}
	for _, p := range problems {
		fmt.Println(p)
	}
	if len(problems) > 0 {
		fmt.Printf("%d size problems: split them (see ../shared/STYLE.md, small packages, one concept each)\n", len(problems))
		os.Exit(1)
	}
}
