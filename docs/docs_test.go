// Package docs holds the project's documentation; its test checks that
// the paths the documents name in code spans exist, so that a moved file
// or package shows up as a failing test rather than a stale document.
package docs

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// span is a Markdown code span.
var span = regexp.MustCompile("`([^`\n]+)`")

// pathLike is a repository path: letters, digits and ._-/ only.
var pathLike = regexp.MustCompile(`^[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)+/?$`)

func TestNamedPathsExist(t *testing.T) {
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	docs, _ := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	docs = append(docs, filepath.Join(root, "README.md"))
	checked := 0
	for _, doc := range docs {
		b, err := os.ReadFile(doc)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range span.FindAllStringSubmatch(string(b), -1) {
			p := m[1]
			if !pathLike.MatchString(p) {
				continue
			}
			top := strings.SplitN(p, "/", 2)[0]
			if fi, err := os.Stat(filepath.Join(root, top)); err != nil || !fi.IsDir() {
				continue // not a path in this repository (a URL, a mount path)
			}
			checked++
			if _, err := os.Stat(filepath.Join(root, p)); err != nil {
				t.Errorf("%s names %s, which does not exist", filepath.Base(doc), p)
			}
		}
	}
	t.Logf("%d paths checked", checked)
	if checked < 20 {
		t.Fatalf("only %d paths checked: the pattern no longer finds them", checked)
	}
}

// Every package of the repository has a row in the README's layout, so
// that a package added is a package described.
func TestEveryPackageInLayout(t *testing.T) {
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	listed := map[string]bool{}
	for _, line := range strings.Split(string(b), "\n") {
		if cells := strings.Split(line, "|"); len(cells) > 2 && strings.HasPrefix(line, "| `") {
			for _, m := range span.FindAllStringSubmatch(cells[1], -1) {
				listed[m[1]] = true
			}
		}
	}
	filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		name := d.Name()
		if d.IsDir() && p != root && (strings.HasPrefix(name, ".") || name == "testdata" || name == "bin" || name == "dist") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(name, ".go") {
			return nil
		}
		dir, _ := filepath.Rel(root, filepath.Dir(p))
		if dir == "." || listed[filepath.ToSlash(dir)] {
			return nil
		}
		listed[filepath.ToSlash(dir)] = true // said once
		t.Errorf("package %s has no row in the README's layout", filepath.ToSlash(dir))
		return nil
	})
	if len(listed) < 20 {
		t.Fatalf("only %d packages in the layout: the table was not found", len(listed))
	}
}
