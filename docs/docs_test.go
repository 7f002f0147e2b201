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
