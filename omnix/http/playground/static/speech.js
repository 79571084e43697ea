// The speech form's fields beyond the text and the voice, as the model card
// says the served pipeline's speech route takes them (GET /v1/models:
// `speech`, omnix's SpeechFields): a Qwen3-TTS checkpoint's instructions
// (how to say it, or the voice described where the card says required),
// its languages, and a voice to clone: a file the person chooses, sent as
// a data: URL in ref_audio, with its transcript in ref_text.  Offers only
// what the card lists, required where it says so; guesses nothing.

const $ = (id) => document.getElementById(id);

// The file the person chose, as the data: URL ref_audio takes.
function dataUrl(file) {
  return new Promise((resolve, reject) => {
    const reader = new FileReader();
    reader.onload = () => resolve(reader.result);
    reader.onerror = () => reject(new Error(`The file ${file.name} could not be read: choose it again.`));
    reader.readAsDataURL(file);
  });
}

// Shows the field `id` (its label `id-field`) when the card takes it.
function offer(id, how) {
  const shown = how === "optional" || how === "required";
  $(`${id}-field`).hidden = !shown;
  $(id).required = how === "required";
  return shown;
}

// Shows the fields `takes` (the card's `speech`; null: none) lists and
// returns what reads them: the body's fields, and a line saying them.
export function speechFields(takes) {
  const none = async () => ({ fields: {}, said: "" });
  if (!takes) return none;
  const instructions = offer("instructions", takes.instructions);
  if (instructions) {
    const required = takes.instructions === "required";
    $("instructions-label").textContent = required ? "The voice, described" : "How to say it (optional)";
    $("instructions").placeholder = required
      ? "A warm, low female voice, speaking slowly"
      : "Very happy, and a little fast";
  }
  const languages = takes.languages || [];
  for (const lang of languages) $("language").append(new Option(lang, lang));
  $("language-field").hidden = languages.length === 0;
  const ref = offer("ref-audio", takes.ref_audio);
  if (ref) {
    const optional = takes.ref_audio === "optional" ? ", optional" : "";
    $("ref-audio-label").textContent = `Voice to clone (an audio file; resampled to ${takes.ref_audio_rate} Hz${optional})`;
  }
  const refText = offer("ref-text", takes.ref_text);
  if (refText) {
    const optional = takes.ref_text === "optional" ? " (optional: then cloned in context)" : "";
    $("ref-text-label").textContent = `What it says${optional}`;
  }
  $("speech").hidden = !(instructions || languages.length || ref || refText);
  if ($("speech").hidden) return none;

  return async () => {
    const fields = {};
    const said = [];
    const how = instructions ? $("instructions").value.trim() : "";
    if (how) {
      fields.instructions = how;
      said.push(`instructions: ${how}`);
    }
    const lang = languages.length ? $("language").value : "auto";
    if (lang !== "auto") {
      fields.language = lang;
      said.push(`language: ${lang}`);
    }
    const file = ref ? $("ref-audio").files[0] : undefined;
    if (file) {
      fields.ref_audio = await dataUrl(file);
      said.push(`voice cloned from ${file.name}`);
    }
    const text = refText ? $("ref-text").value.trim() : "";
    if (text) {
      fields.ref_text = text;
      said.push(`which says: ${text}`);
    }
    return { fields, said: said.join(" · ") };
  };
}
