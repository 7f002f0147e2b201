package chart

import (
	"bytes"
	"encoding/xml"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func sample() *Chart {
	return &Chart{
		Title:   "Trees of small files",
		Note:    "2 cores, 2026-11-26",
		Columns: 2,
		Panels: []Panel{
			{Title: "cp -r", XLabel: "files", YLabel: "seconds", LogX: true, LogY: true, Series: []Series{
				{Name: "local", X: []float64{1000, 2000, 4000}, Y: []float64{0.03, 0.06, 0.12}},
				// Not measured at 2,000 files: left out, not drawn at zero.
				{Name: "hoard", X: []float64{1000, 2000, 4000}, Y: []float64{0.9, 0, 3.5}},
			}},
			{Title: "a file of 1 GiB", YLabel: "× local", Categories: []string{"write", "cold read"}, Ref: 1, RefName: "local", Series: []Series{
				{Name: "bindfs", Y: []float64{0.09, 1.4}},
				{Name: "hoard", Y: []float64{0.35, 0.54}},
			}},
			{Title: "third panel, second row", XLabel: "bias", YLabel: "tx/s", Series: []Series{
				{Name: "delegations", X: []float64{0, 5, 10}, Y: []float64{900, 1200, 2000}},
			}},
		},
	}
}

// svgText is the text of every element of an SVG file, which must parse.
func svgText(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var texts strings.Builder
	d := xml.NewDecoder(bytes.NewReader(b))
	for {
		tok, err := d.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("%s is not well-formed: %v", path, err)
		}
		if cd, ok := tok.(xml.CharData); ok {
			texts.Write(cd)
			texts.WriteByte('\n')
		}
	}
	return texts.String()
}

func TestSaveAndRedraw(t *testing.T) {
	dir := t.TempDir()
	if err := sample().Save(dir, "tree"); err != nil {
		t.Fatal(err)
	}
	got := svgText(t, filepath.Join(dir, "tree.svg"))
	for _, want := range []string{"Trees of small files", "2 cores, 2026-11-26", "cp -r", "local", "hoard", "bindfs", "write", "cold read", "delegations", "4000"} {
		if !strings.Contains(got, want) {
			t.Errorf("the SVG has no text %q", want)
		}
	}
	first, _ := os.ReadFile(filepath.Join(dir, "tree.svg"))
	os.Remove(filepath.Join(dir, "tree.svg"))
	drawn, err := RenderDir(dir)
	if err != nil || len(drawn) != 1 {
		t.Fatalf("RenderDir: %v, %v", drawn, err)
	}
	again, _ := os.ReadFile(drawn[0])
	if !bytes.Equal(first, again) {
		t.Error("the figure drawn again from its JSON differs from the first")
	}
}

func TestBadCharts(t *testing.T) {
	dir := t.TempDir()
	for name, c := range map[string]*Chart{
		"no panels":     {Title: "x"},
		"log bars":      {Panels: []Panel{{LogY: true, Categories: []string{"a"}, Series: []Series{{Name: "s", Y: []float64{1}}}}}},
		"short bars":    {Panels: []Panel{{Categories: []string{"a", "b"}, Series: []Series{{Name: "s", Y: []float64{1}}}}}},
		"uneven lines":  {Panels: []Panel{{Series: []Series{{Name: "s", X: []float64{1, 2}, Y: []float64{1}}}}}},
		"nothing drawn": {Panels: []Panel{{LogY: true, Series: []Series{{Name: "s", X: []float64{1}, Y: []float64{0}}}}}},
	} {
		if err := c.Render(filepath.Join(dir, "x.svg")); err == nil {
			t.Errorf("%s: drawn without an error", name)
		}
	}
	if _, err := RenderDir(dir + "/none"); err == nil {
		t.Error("RenderDir of a directory with no figures: no error")
	}
}
