"""Write Silero VAD's reference frames (a generated utterance at 16 and 8 kHz, with real
states) and the same utterance's spectrogram for the denoiser example.

Why generated: no package on PyPI ships a speech recording inside its wheel, and
the project fetches nothing but wheels. The signal is built the way speech is:
silence, then voiced segments (a glottal pulse train at 110-220 Hz through three
formant resonators, with a syllable envelope), unvoiced noise bursts, and room
noise under all of it. Each frame is what Silero VAD's own iterator feeds the
model: 64 samples of context and 512 new ones at 16 kHz (32 and 256 at 8 kHz),
with the recurrent state the FP32 model left after the previous frame, so the
policy judges the model in the states it really runs in.

Usage: python scripts/make_audio.py [--out models] (needs models/silero_vad.onnx)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

FRAMES = {16000: (512, 64), 8000: (256, 32)}  # rate -> (new samples, context) a frame


def utterance(seconds: float = 3.0, seed: int = 5, rate: int = 16000) -> np.ndarray:
    """A speech-like signal in [-1, 1]: silence, two voiced phrases, a fricative, silence."""
    rng = np.random.default_rng(seed)
    n = int(rate * seconds)
    t = np.arange(n) / rate
    signal = rng.normal(0, 0.003, n)  # room noise
    for start, length, f0 in ((0.5, 0.9, 140.0), (1.7, 0.8, 190.0)):
        a, b = int(start * rate), int((start + length) * rate)
        pitch = f0 * (1 + 0.08 * np.sin(2 * np.pi * 3 * t[a:b]))  # intonation
        phase = np.cumsum(pitch / rate)
        pulses = (np.diff(np.floor(phase), prepend=0) > 0).astype(float)
        formants = ((700, 90), (1200, 110), (2600, 160))
        voiced = sum(_resonate(pulses, f, bw, rate) for f, bw in formants)
        syllables = np.clip(np.sin(np.pi * 4 * (t[a:b] - start) / length), 0, None) ** 0.5
        signal[a:b] += 0.9 * voiced / np.abs(voiced).max() * syllables  # normalised speech
    a, b = int(2.6 * rate), int(2.75 * rate)
    hiss = min(4500, rate * 0.4)
    signal[a:b] += _resonate(rng.normal(0, 1, b - a), hiss, 1500, rate) * 0.02  # "s"
    return np.clip(signal, -1, 1).astype(np.float32)


def _resonate(x: np.ndarray, freq: float, bandwidth: float, rate: int) -> np.ndarray:
    """A two-pole resonator (a formant) applied to `x`."""
    r = np.exp(-np.pi * bandwidth / rate)
    c1, c2 = 2 * r * np.cos(2 * np.pi * freq / rate), -r * r
    y = np.zeros_like(x, dtype=np.float64)
    for i in range(len(x)):
        y[i] = x[i] + c1 * (y[i - 1] if i else 0) + c2 * (y[i - 2] if i > 1 else 0)
    return y


def frames(model: Path, audio: np.ndarray, rate: int) -> dict[str, np.ndarray]:
    """Every frame with its context, and the state the FP32 model had before it."""
    import onnxruntime as ort

    hop, width = FRAMES[rate]
    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    state = np.zeros((2, 1, 128), np.float32)
    context = np.zeros(width, np.float32)
    inputs, states, speech = [], [], []
    for k in range(len(audio) // hop):
        chunk = np.concatenate([context, audio[k * hop : (k + 1) * hop]])[None]
        inputs.append(chunk)
        states.append(state)
        feed = {"input": chunk, "state": state, "sr": np.array(rate, np.int64)}
        prob, state = session.run(None, feed)
        speech.append(float(prob.squeeze()))
        context = chunk[0, -width:]
    return {"input": np.stack(inputs), "state": np.stack(states), "speech": np.array(speech)}


def spectrogram(audio: np.ndarray, window: int = 320, hop: int = 160) -> np.ndarray:
    """log(1 + |STFT|) frames as a speech enhancer reads them: [frames, window // 2 + 1]."""
    count = 1 + (len(audio) - window) // hop
    taps = np.hanning(window).astype(np.float32)
    frames = np.stack([audio[k * hop : k * hop + window] * taps for k in range(count)])
    return np.log1p(np.abs(np.fft.rfft(frames, axis=1))).astype(np.float32)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("models"))
    args = parser.parse_args(argv)
    model = args.out / "silero_vad.onnx"
    if not model.is_file():
        print(f"make_audio: {model} not found; run scripts/fetch_models.py first", file=sys.stderr)
        return 2
    for rate, name in ((16000, "silero_vad_frames.npz"), (8000, "silero_vad_frames_8k.npz")):
        data = frames(model, utterance(rate=rate), rate)
        path = args.out / name
        tmp = path.with_name(f".{path.name}.tmp.npz")
        every = slice(None, None, 3)  # about 30 frames across the utterance
        np.savez(tmp, input=data["input"][every], state=data["state"][every])
        tmp.replace(path)
        p = data["speech"][every]
        print(f"wrote {path}: {len(p)} frames, speech probability {p.min():.2f}..{p.max():.2f}")
    spec = spectrogram(utterance())[None]  # one sample: [1, frames, bins]
    path = args.out / "denoiser_frames.npz"
    tmp = path.with_name(f".{path.name}.tmp.npz")
    np.savez(tmp, spec=spec)
    tmp.replace(path)
    print(f"wrote {path}: {spec.shape[1]} spectrogram frames of {spec.shape[2]} bins")
    return 0


if __name__ == "__main__":
    sys.exit(main())
