// AudioWorklet: microphone samples at the context rate -> 16 kHz mono s16le chunks.
// Decimation averages the input samples that fall into each output sample (a boxcar low-pass),
// which is enough anti-aliasing for speech; any context rate works (44.1k, 48k, 96k...).
class PcmCapture extends AudioWorkletProcessor {
  constructor(options) {
    super();
    const o = (options && options.processorOptions) || {};
    this.target = o.targetRate || 16000;
    this.chunk = o.chunk || 320; // 20 ms at 16 kHz
    this.step = sampleRate / this.target;
    this.pos = 0; this.acc = 0; this.cnt = 0;
    this.out = new Int16Array(this.chunk); this.fill = 0;
    this.port.onmessage = (e) => { if (e.data === 'flush') this.flush(); };
  }
  flush() {
    if (this.fill > 0) {
      this.port.postMessage(this.out.slice(0, this.fill).buffer, []);
      this.fill = 0;
    }
  }
  process(inputs) {
    const input = inputs[0];
    if (!input || input.length === 0) return true;
    const ch0 = input[0], ch1 = input.length > 1 ? input[1] : null;
    for (let i = 0; i < ch0.length; i++) {
      this.acc += ch1 ? (ch0[i] + ch1[i]) * 0.5 : ch0[i];
      this.cnt++;
      this.pos += 1;
      if (this.pos >= this.step) {
        this.pos -= this.step;
        let v = this.acc / this.cnt;
        this.acc = 0; this.cnt = 0;
        v = Math.max(-1, Math.min(1, v));
        this.out[this.fill++] = v < 0 ? v * 32768 : v * 32767;
        if (this.fill === this.chunk) {
          this.port.postMessage(this.out.buffer, [this.out.buffer]);
          this.out = new Int16Array(this.chunk); this.fill = 0;
        }
      }
    }
    return true;
  }
}
registerProcessor('pcm-capture', PcmCapture);
