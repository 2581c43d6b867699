// streamkit browser demo: no build step. Speaks the protocol of DESIGN.md on ws://HOST/ws.
const $ = (id) => document.getElementById(id);
const query = new URLSearchParams(location.search);
const INPUT_RATE = 16000;
const COLORS = ['#60a5fa', '#f472b6', '#34d399', '#fbbf24', '#a78bfa', '#f87171', '#22d3ee', '#a3e635'];

const S = window.streamkit = {
  ws: null, running: false, ready: null, pipelines: {}, file: null,
  audioBytes: 0, audioChunks: 0, transcripts: [], texts: {}, errors: [], detections: 0,
  capture: null, play: null, series: {}, stop: null,
};

function setStatus(text, cls) { const el = $('status'); el.textContent = text; el.className = 'status ' + (cls || ''); }
function log(line) {
  const el = $('log');
  el.textContent = (line + '\n' + el.textContent).split('\n').slice(0, 80).join('\n');
}

// ------------------------------------------------------------------ pipelines
async function loadPipelines() {
  const sel = $('pipeline');
  try {
    const h = await (await fetch('/healthz')).json();
    S.pipelines = h.pipeline_inputs || {};
    for (const name of h.pipelines || []) {
      const o = document.createElement('option'); o.value = o.textContent = name; sel.appendChild(o);
    }
    const want = query.get('pipeline');
    if (want) sel.value = want;
    pickSource();
  } catch (e) { setStatus('server unreachable', 'error'); }
}
function takesVideo(name) { const i = S.pipelines[name]; return !!(i && i.includes('video') && !i.includes('audio')); }
function pickSource() {
  const name = $('pipeline').value;
  if (query.get('source')) { $('source').value = query.get('source'); return; }
  if (S.file) { $('source').value = 'file'; return; }
  $('source').value = takesVideo(name) ? 'camera' : 'mic';
}
$('pipeline').addEventListener('change', pickSource);

// ------------------------------------------------------------------ socket
function wsUrl() {
  const proto = location.protocol === 'https:' ? 'wss:' : 'ws:';
  const token = query.get('token');
  return `${proto}//${location.host}/ws` + (token ? `?token=${encodeURIComponent(token)}` : '');
}

function sendAudio(buffer) { // ArrayBuffer of s16le samples at 16 kHz
  if (!S.running || !S.ws || S.ws.readyState !== 1) return;
  const msg = new Uint8Array(buffer.byteLength + 1);
  msg[0] = 1; msg.set(new Uint8Array(buffer), 1);
  S.ws.send(msg);
}
function sendJpeg(buffer) {
  if (!S.running || !S.ws || S.ws.readyState !== 1) return;
  if (S.ws.bufferedAmount > 512 * 1024) return; // the link is behind: skip this frame (video may be dropped)
  const msg = new Uint8Array(buffer.byteLength + 1);
  msg[0] = 2; msg.set(new Uint8Array(buffer), 1);
  S.ws.send(msg);
}

async function start() {
  const pipeline = $('pipeline').value;
  if (!pipeline) return;
  resetView();
  $('start').disabled = true; $('stop').disabled = false;
  setStatus('connecting', 'connecting');
  S.play = new Player();
  const ws = S.ws = new WebSocket(wsUrl());
  ws.binaryType = 'arraybuffer';
  ws.onopen = () => ws.send(JSON.stringify({
    type: 'start', pipeline, params: { live: true },
    audio: { sample_rate: INPUT_RATE, format: 's16le', channels: 1 },
  }));
  ws.onmessage = (e) => {
    if (typeof e.data === 'string') onEvent(JSON.parse(e.data));
    else onAudio(e.data);
  };
  ws.onclose = (e) => {
    log(`closed ${e.code} ${e.reason || ''}`);
    stopCapture();
    S.running = false;
    $('start').disabled = false; $('stop').disabled = true;
    if (!$('status').classList.contains('error')) setStatus(`ended (${e.code})`, 'idle');
  };
  ws.onerror = () => setStatus('connection failed', 'error');
}

function stop() {
  $('stop').disabled = true;
  stopCapture();
  if (S.ws && S.ws.readyState === 1) S.ws.send(JSON.stringify({ type: 'stop' }));
  setStatus('flushing', 'connecting');
}

async function onReady(ev) {
  S.ready = ev; S.running = true;
  S.play.rate = ev.output_audio.sample_rate;
  setStatus('live · ' + ev.session, 'live');
  try {
    const src = $('source').value;
    if (src === 'file' && S.file) await streamFile(S.file);
    else if (src === 'camera' || takesVideo($('pipeline').value)) await startCamera();
    else await startMic();
  } catch (e) {
    log('capture failed: ' + e); setStatus('capture failed: ' + e.message, 'error'); stop();
  }
}

// ------------------------------------------------------------------ events
function onEvent(ev) {
  switch (ev.type) {
    case 'ready': log(JSON.stringify(ev)); onReady(ev); break;
    case 'transcript': onTranscript(ev); break;
    case 'text': onText(ev); break;
    case 'detections': onDetections(ev); break;
    case 'metrics': onMetrics(ev); break;
    case 'error': S.errors.push(ev); log(`error ${ev.code}: ${ev.message}`); break;
    case 'end': log('end'); setStatus('ended', 'idle'); break;
    case 'event':
      if (ev.name === 'interrupt') S.play.flush(); // barge-in: drop the answer's queued audio
      if (ev.name !== 'speech_pause' && ev.name !== 'speech_resume') log(`${ev.name} ${JSON.stringify(ev.data)}`);
      break;
    default: log(JSON.stringify(ev));
  }
}

function onTranscript(ev) {
  const partial = $('partial');
  if (!ev.final) { partial.textContent = ev.text; return; }
  S.transcripts.push(ev);
  const p = document.createElement('p'); p.className = 'final';
  const ts = document.createElement('span'); ts.className = 'ts';
  ts.textContent = `${ev.start.toFixed(1)}–${ev.end.toFixed(1)}s`;
  p.append(ts, document.createTextNode(ev.text));
  $('transcript').insertBefore(p, partial);
  partial.textContent = '';
}

function onText(ev) {
  // partial text events are streamed pieces; the final one carries the whole text
  let cur = S.texts[ev.stage];
  if (!cur) {
    cur = S.texts[ev.stage] = document.createElement('p');
    const tag = document.createElement('span'); tag.className = 'stage'; tag.textContent = ev.stage;
    cur.append(tag, document.createTextNode(''));
    $('texts').appendChild(cur);
  }
  const body = cur.lastChild;
  body.textContent = ev.final ? ev.text : body.textContent + ev.text;
  if (ev.final) { cur.classList.add('final'); delete S.texts[ev.stage]; }
  $('texts').scrollTop = 1e9;
}

// ------------------------------------------------------------------ audio out (gapless)
class Player {
  constructor() { this.ctx = null; this.rate = 24000; this.next = 0; this.level = 0; this.sources = new Set(); }
  push(pcm) {
    if (!$('play').checked) return;
    if (!this.ctx) this.ctx = new AudioContext({ sampleRate: this.rate });
    const n = pcm.length, buf = this.ctx.createBuffer(1, n, this.rate), ch = buf.getChannelData(0);
    let peak = 0;
    for (let i = 0; i < n; i++) { ch[i] = pcm[i] / 32768; peak = Math.max(peak, Math.abs(ch[i])); }
    this.level = peak;
    const src = this.ctx.createBufferSource(); src.buffer = buf; src.connect(this.ctx.destination);
    const now = this.ctx.currentTime;
    if (this.next < now + 0.02) this.next = now + 0.08; // (re)start with a small jitter buffer
    src.start(this.next);
    this.next += buf.duration;
    this.sources.add(src);
    src.onended = () => this.sources.delete(src);
  }
  flush() {
    for (const src of this.sources) { try { src.stop(); } catch (e) { /* already stopped */ } }
    this.sources.clear();
    this.next = 0;
  }
  close() { if (this.ctx) this.ctx.close(); this.ctx = null; }
}

function onAudio(data) {
  const bytes = new Uint8Array(data);
  if (bytes[0] !== 1) return;
  const pcm = new Int16Array(data.slice(1));
  S.audioBytes += pcm.byteLength; S.audioChunks += 1;
  const el = $('audio-stats');
  el.dataset.bytes = S.audioBytes; el.dataset.chunks = S.audioChunks;
  const secs = S.audioBytes / 2 / (S.ready ? S.ready.output_audio.sample_rate : 24000);
  el.textContent = `${secs.toFixed(2)} s received in ${S.audioChunks} chunks`;
  S.play.push(pcm);
  drawLevel();
}
function drawLevel() {
  const c = $('level'), g = c.getContext('2d');
  g.clearRect(0, 0, c.width, c.height);
  g.fillStyle = '#34d399';
  g.fillRect(0, 0, c.width * Math.min(1, (S.play && S.play.level) || 0), c.height);
}

// ------------------------------------------------------------------ latency chart
function onMetrics(ev) {
  for (const [name, st] of Object.entries(ev.stages || {})) {
    const s = S.series[name] || (S.series[name] = []);
    s.push(st.latency_ms_p50 ?? st.latency_ms_last ?? 0);
    if (s.length > 60) s.shift();
  }
  drawChart();
}
function drawChart() {
  // log scale: a 5 ms VAD and a 5 s LLM turn are both readable
  const c = $('chart'), g = c.getContext('2d'), W = c.width, H = c.height;
  g.clearRect(0, 0, W, H);
  const names = Object.keys(S.series);
  let max = 10;
  for (const n of names) for (const v of S.series[n]) max = Math.max(max, v);
  const top = Math.log10(max * 1.5 + 1);
  const yOf = (v) => H - 12 - (H - 20) * Math.log10(Math.max(0, v) + 1) / top;
  g.strokeStyle = '#262c35'; g.fillStyle = '#6b7684'; g.font = '10px sans-serif';
  for (const tick of [1, 10, 100, 1000, 10000]) {
    if (tick > max * 1.5) break;
    const y = yOf(tick);
    g.beginPath(); g.moveTo(34, y); g.lineTo(W, y); g.stroke();
    g.fillText(tick >= 1000 ? `${tick / 1000}s` : `${tick}`, 2, y + 3);
  }
  const legend = $('legend'); legend.innerHTML = '';
  names.forEach((n, k) => {
    const s = S.series[n], color = COLORS[k % COLORS.length];
    g.strokeStyle = color; g.lineWidth = 1.5; g.beginPath();
    s.forEach((v, i) => {
      const x = 34 + (W - 36) * (i + 60 - s.length) / 59, y = yOf(v);
      i ? g.lineTo(x, y) : g.moveTo(x, y);
    });
    g.stroke();
    const item = document.createElement('span');
    item.innerHTML = `<i style="background:${color}"></i>`;
    const last = s[s.length - 1];
    item.append(`${n} ${last >= 1000 ? (last / 1000).toFixed(2) + ' s' : last.toFixed(1) + ' ms'}`);
    legend.appendChild(item);
  });
}

// ------------------------------------------------------------------ capture: microphone
async function startMic() {
  const stream = await navigator.mediaDevices.getUserMedia({
    audio: { channelCount: 1, echoCancellation: true, noiseSuppression: true, autoGainControl: true } });
  const ctx = new AudioContext();
  await ctx.audioWorklet.addModule('pcm-worklet.js');
  const src = ctx.createMediaStreamSource(stream);
  const node = new AudioWorkletNode(ctx, 'pcm-capture', { processorOptions: { targetRate: INPUT_RATE, chunk: 320 } });
  node.port.onmessage = (e) => sendAudio(e.data);
  const mute = ctx.createGain(); mute.gain.value = 0;
  src.connect(node); node.connect(mute); mute.connect(ctx.destination);
  S.capture = { stop: () => { node.port.postMessage('flush'); stream.getTracks().forEach((t) => t.stop()); setTimeout(() => ctx.close(), 100); } };
  log(`microphone at ${ctx.sampleRate} Hz -> ${INPUT_RATE} Hz s16le`);
}

// ------------------------------------------------------------------ capture: camera / video file
function frameLoop(video, fps) {
  const canvas = document.createElement('canvas');
  let timer = null, busy = false;
  const tick = () => {
    if (!S.running || video.readyState < 2 || busy) return;
    const w = Math.min(640, video.videoWidth), h = Math.round(video.videoHeight * w / video.videoWidth);
    if (!w || !h) return;
    canvas.width = w; canvas.height = h;
    canvas.getContext('2d').drawImage(video, 0, 0, w, h);
    S.sentWidth = w; busy = true;
    canvas.toBlob(async (blob) => { busy = false; if (blob) sendJpeg(await blob.arrayBuffer()); }, 'image/jpeg', 0.75);
  };
  timer = setInterval(tick, 1000 / fps);
  return () => clearInterval(timer);
}
async function startCamera() {
  const stream = await navigator.mediaDevices.getUserMedia({ video: { width: 640 } });
  const video = $('video'); $('video-panel').hidden = false;
  video.srcObject = stream; await video.play();
  const stopLoop = frameLoop(video, 10);
  S.capture = { stop: () => { stopLoop(); stream.getTracks().forEach((t) => t.stop()); } };
}
function onDetections(ev) {
  S.detections += 1;
  const video = $('video'), c = $('overlay'), g = c.getContext('2d');
  c.width = video.videoWidth || 640; c.height = video.videoHeight || 480;
  g.clearRect(0, 0, c.width, c.height);
  const k = c.width / (S.sentWidth || c.width);
  g.lineWidth = 3; g.font = '16px sans-serif';
  for (const o of ev.objects) {
    const [x, y, w, h] = o.box.map((v) => v * k);
    g.strokeStyle = o.label === 'face' ? '#f472b6' : o.label === 'person' ? '#60a5fa' : '#fbbf24';
    g.strokeRect(x, y, w, h);
    g.fillStyle = g.strokeStyle;
    g.fillText(`${o.label} ${(o.score ?? 0).toFixed(2)}`, x + 3, Math.max(14, y - 4));
  }
  $('det-count').textContent = `${ev.objects.length} object(s) at ${ev.pts.toFixed(2)} s`;
}

// ------------------------------------------------------------------ capture: dropped file
async function streamFile(file) {
  if (file.type.startsWith('video/') && takesVideo($('pipeline').value)) {
    const video = $('video'); $('video-panel').hidden = false;
    video.srcObject = null; video.src = URL.createObjectURL(file); await video.play();
    const stopLoop = frameLoop(video, 10);
    video.onended = () => { stopLoop(); stop(); };
    S.capture = { stop: () => { stopLoop(); video.pause(); } };
    return;
  }
  const ctx = new AudioContext();
  const decoded = await ctx.decodeAudioData(await file.arrayBuffer());
  ctx.close();
  const off = new OfflineAudioContext(1, Math.ceil(decoded.duration * INPUT_RATE), INPUT_RATE);
  const src = off.createBufferSource(); src.buffer = decoded; src.connect(off.destination); src.start();
  const pcm = (await off.startRendering()).getChannelData(0);
  const chunk = INPUT_RATE / 10; // 100 ms, sent at real-time pace
  let i = 0, t0 = performance.now();
  log(`streaming ${file.name}: ${decoded.duration.toFixed(1)} s`);
  await new Promise((resolve) => {
    const timer = setInterval(() => {
      const due = ((performance.now() - t0) / 1000) * INPUT_RATE;
      while (i < pcm.length && i <= due) {
        const part = pcm.subarray(i, i + chunk), out = new Int16Array(part.length);
        for (let j = 0; j < part.length; j++) { const v = Math.max(-1, Math.min(1, part[j])); out[j] = v < 0 ? v * 32768 : v * 32767; }
        sendAudio(out.buffer); i += chunk;
      }
      if (i >= pcm.length || !S.running) { clearInterval(timer); resolve(); }
    }, 20);
    S.capture = { stop: () => { clearInterval(timer); resolve(); } };
  });
  if (S.running) stop();
}

function stopCapture() { if (S.capture) { const c = S.capture; S.capture = null; c.stop(); } }

function resetView() {
  $('transcript').innerHTML = '<p id="partial" class="partial"></p>';
  $('texts').innerHTML = ''; $('log').textContent = '';
  S.texts = {}; S.transcripts = []; S.errors = []; S.audioBytes = 0; S.audioChunks = 0; S.series = {};
  const el = $('audio-stats'); el.dataset.bytes = 0; el.dataset.chunks = 0; el.textContent = 'no audio yet';
  if (S.play) S.play.close();
}

// ------------------------------------------------------------------ file drop
const drop = $('drop');
function useFile(f) { if (!f) return; S.file = f; $('file-name').textContent = ' · ' + f.name; $('source').value = 'file'; }
drop.addEventListener('dragover', (e) => { e.preventDefault(); drop.classList.add('over'); });
drop.addEventListener('dragleave', () => drop.classList.remove('over'));
drop.addEventListener('drop', (e) => { e.preventDefault(); drop.classList.remove('over'); useFile(e.dataTransfer.files[0]); });
$('file').addEventListener('change', (e) => useFile(e.target.files[0]));
$('start').addEventListener('click', start);
$('stop').addEventListener('click', stop);
loadPipelines();
