package deploy

import (
	"bufio"
	"encoding/json"
	"os"
	"path"
	"strconv"
	"strings"
	"testing"
)

// TestDockerfile checks what the manifests take from the image, since no
// image is built here: the containers give args only ("join", flags), so
// each image the manifests run (the last stage, and llamacpp) must have
// dpnode as its entrypoint, and run as a numeric user other than root, which
// runAsNonRoot can verify.
func TestDockerfile(t *testing.T) {
	f, err := os.Open("Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	type stage struct{ name, entrypoint, user string }
	var stages []*stage
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		instr, rest, _ := strings.Cut(line, " ")
		switch strings.ToUpper(instr) {
		case "FROM":
			s := &stage{}
			if fields := strings.Fields(rest); len(fields) == 3 && strings.EqualFold(fields[1], "AS") {
				s.name = fields[2]
			}
			stages = append(stages, s)
		case "ENTRYPOINT":
			stages[len(stages)-1].entrypoint = rest
		case "USER":
			stages[len(stages)-1].user = rest
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if len(stages) == 0 {
		t.Fatal("no FROM in the Dockerfile")
	}
	run := map[string]*stage{"the last stage": stages[len(stages)-1]}
	for _, s := range stages {
		if s.name == "llamacpp" {
			run["llamacpp"] = s
		}
	}
	if len(run) != 2 {
		t.Errorf("no stage llamacpp, which components/llamacpp runs")
	}
	for what, s := range run {
		var entrypoint []string
		if err := json.Unmarshal([]byte(s.entrypoint), &entrypoint); err != nil || len(entrypoint) != 1 || path.Base(entrypoint[0]) != "dpnode" {
			t.Errorf("%s: ENTRYPOINT %s: want the exec form of dpnode alone, which the manifests give args to", what, s.entrypoint)
		}
		uid, _, _ := strings.Cut(s.user, ":")
		if n, err := strconv.Atoi(uid); err != nil || n == 0 {
			t.Errorf("%s: USER %q: want a numeric user other than root", what, s.user)
		}
	}
}
