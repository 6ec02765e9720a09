package registry

import "testing"

func TestForModelPicksTheEngineOfTheFile(t *testing.T) {
	engines := []Engine{{Name: "sim"}, {Name: "llamacpp", ModelSuffix: ".gguf"}}
	for model, want := range map[string]string{"/models/x.gguf": "llamacpp", "X.GGUF": "llamacpp", "org/model": "", "x.gguf.txt": ""} {
		e, ok := ForModel(engines, model)
		if got := map[bool]string{true: e.Name}[ok]; got != want {
			t.Errorf("ForModel(%q) = %q, want %q", model, got, want)
		}
	}
}
