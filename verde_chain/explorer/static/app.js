// verde_chain explorer: one page, three views routed by the URL's hash (#/, #/job/N, #/dispute/N).
// The server pushes its brief state over server-sent events (/api/stream); a view that shows one
// job or dispute re-reads /api/jobs/N or /api/disputes/N whenever that state's version moves.
// Countdowns and chess clocks tick here between updates, from the chain's own time.
"use strict";

const S = { summary: null, detail: null, detailKey: null, detailVersion: -1, received: 0, stream: "connecting" };

// -- small DOM helpers (text only: nothing from the chain is ever parsed as HTML) --------------------

function h(tag, attrs, ...kids) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "class") el.className = v;
    else el.setAttribute(k, v === true ? "" : String(v));
  }
  for (const kid of kids.flat()) {
    if (kid === null || kid === undefined || kid === false) continue;
    el.append(kid instanceof Node ? kid : document.createTextNode(String(kid)));
  }
  return el;
}
const svgNS = "http://www.w3.org/2000/svg";
function s(tag, attrs, text) {
  const el = document.createElementNS(svgNS, tag);
  for (const [k, v] of Object.entries(attrs || {})) el.setAttribute(k, String(v));
  if (text !== undefined) el.textContent = text;
  return el;
}

// -- formatting ---------------------------------------------------------------------------------------

const isAddress = (v) => typeof v === "string" && /^0x[0-9a-fA-F]{40}$/.test(v);
const isHash = (v) => typeof v === "string" && /^0x[0-9a-fA-F]{64}$/.test(v);
const AMOUNT_KEY = /(reward|stake|bond|amount|paid)/;
const DEADLINE_KEY = /deadline$/;
const ZERO_ADDRESS = "0x0000000000000000000000000000000000000000";

function short(v) { return v.slice(0, 8) + "…" + v.slice(-4); }
function role(summaryOrDetail, addr) {
  if (!addr) return null;
  if (addr === summaryOrDetail.defender) return "defender";
  if (addr === summaryOrDetail.challenger) return "challenger";
  return null;
}
function addr(v, d) {
  const r = d ? role(d, v) : null;
  return h("span", { class: "addr", title: v }, r ? `${r} ` : "", h("code", {}, short(v)));
}
function amount(raw, token) {
  if (raw === null || raw === undefined) return "–";
  const sym = token ? token.symbol : "";
  const dec = token ? token.decimals : null;
  let n;
  try { n = BigInt(String(raw)); } catch (e) { return String(raw); }
  if (dec === null || dec === undefined) return `${n} ${sym} (raw units)`;
  const neg = n < 0n; if (neg) n = -n;
  const base = 10n ** BigInt(dec);
  const whole = n / base;
  let frac = (n % base).toString().padStart(dec, "0").replace(/0+$/, "");
  return `${neg ? "-" : ""}${whole}${frac ? "." + frac : ""} ${sym}`;
}
function utc(ts) {
  if (!ts && ts !== 0) return "–";
  return new Date(Number(ts) * 1000).toISOString().replace("T", " ").replace(".000Z", "Z");
}
function hms(ts) { return utc(ts).slice(11); }
function duration(sec) {
  sec = Math.max(0, Math.floor(sec));
  const d = Math.floor(sec / 86400), hh = Math.floor(sec / 3600) % 24, mm = Math.floor(sec / 60) % 60, ss = sec % 60;
  const p = (x) => String(x).padStart(2, "0");
  return (d ? `${d}d ` : "") + `${p(hh)}:${p(mm)}:${p(ss)}`;
}
// The chain's time now: the snapshot's "now" (pending block) advanced at wall-clock speed since it was served.
function chainNow() {
  if (!S.summary || !S.summary.chain) return null;
  const sm = S.summary;
  return Number(sm.chain.now) + (Number(sm.served_at) - Number(sm.updated)) + (Date.now() - S.received) / 1000;
}
function countdown(deadline) {
  return h("span", { class: "countdown", "data-deadline": deadline }, "");
}
function value(key, v, ctx) {
  if (v === null || v === undefined) return "–";
  if (typeof v === "boolean") return v ? "yes" : "no";
  if (ctx && ctx.token && AMOUNT_KEY.test(key) && /^-?\d+$/.test(String(v))) return amount(v, ctx.token);
  if (DEADLINE_KEY.test(key) && /^\d+$/.test(String(v))) return h("span", {}, utc(v), " ", countdown(v));
  if (key === "token" && v === ZERO_ADDRESS) return "ETH";
  if (isAddress(v)) return addr(v, ctx && ctx.parties);
  if (isHash(v)) return h("code", { title: v }, short(v));
  if (typeof v === "object") return h("code", { class: "json" }, JSON.stringify(v));
  return String(v);
}
function kvTable(obj, ctx, skip) {
  const rows = Object.entries(obj || {}).filter(([k]) => !(skip || []).includes(k));
  return h("table", { class: "kv" }, rows.map(([k, v]) => h("tr", { "data-key": k }, h("th", {}, k), h("td", {}, value(k, v, ctx)))));
}
function grid(rows, ctx, opts) {
  opts = opts || {};
  if (!rows || !rows.length) return h("p", { class: "muted" }, opts.empty || "none");
  const cols = opts.cols || [...new Set(rows.flatMap((r) => Object.keys(r)))];
  return h("table", { class: "grid" },
    h("thead", {}, h("tr", {}, cols.map((c) => h("th", {}, c)))),
    h("tbody", {}, rows.map((r) => h("tr", opts.rowAttrs ? opts.rowAttrs(r) : {},
      cols.map((c) => h("td", { "data-col": c }, opts.cell && opts.cell(c, r) !== undefined ? opts.cell(c, r) : value(c, r[c], ctx)))))));
}
// Replace an element's children, leaving out the absent ones (null: a panel not shown yet).
function fill(el, ...kids) { el.replaceChildren(...kids.flat().filter((k) => k !== null && k !== undefined && k !== false)); }
function statusTag(v) { return h("span", { class: `tag tag-${String(v).toLowerCase()}` }, String(v)); }
function section(title, ...kids) { return h("section", {}, h("h3", {}, title), ...kids); }

// -- status banner and header ----------------------------------------------------------------------

function renderBanner() {
  const el = document.getElementById("status");
  const sm = S.summary;
  let status, text;
  if (S.stream === "down") {
    status = "server-down"; text = "explorer server unreachable, retrying…";
  } else if (!sm) {
    status = "starting"; text = "connecting to the explorer…";
  } else {
    status = sm.status;
    text = sm.status === "ok"
      ? `following ${sm.rpc_url}: block ${sm.chain.block} at ${utc(sm.chain.block_time)}`
      : sm.message + (sm.stale && sm.chain
        ? ` (since ${new Date(sm.since * 1000).toLocaleTimeString()}; below: block ${sm.chain.block}, as last read)` : "");
  }
  el.dataset.status = status;
  el.textContent = text;
  document.body.dataset.stale = sm && sm.stale ? "yes" : "no";
  const chain = document.getElementById("chain");
  chain.textContent = sm && sm.chain
    ? `chain ${sm.chain.chain_id} · JobMarket ${short(sm.market)} · DisputeGame ${sm.game ? short(sm.game) : "–"}`
    : sm ? `JobMarket ${short(sm.market)}` : "";
}

// -- views -------------------------------------------------------------------------------------------

function route() {
  const m = location.hash.match(/^#\/(job|dispute)\/(\d+)/);
  return m ? { view: m[1], id: Number(m[2]) } : { view: "home" };
}

function renderHome(view) {
  const sm = S.summary;
  if (!sm) return;
  fill(view, 
    section("Jobs", grid(sm.jobs, null, {
      empty: sm.status === "no_contracts" ? "no JobMarket at this address" : "no job posted on this market",
      rowAttrs: (j) => ({ "data-job": j.job_id }),
      cell: (c, j) => c === "job_id" ? h("a", { href: `#/job/${j.job_id}` }, `job ${j.job_id}`)
        : c === "status" ? statusTag(j.status)
        : c === "reward" ? amount(j.reward, j.token)
        : c === "token" ? j.token.symbol : undefined,
    })),
    section("Disputes", grid(sm.disputes, null, {
      empty: "no dispute opened",
      rowAttrs: (d) => ({ "data-game": d.game_id }),
      cell: (c, d) => c === "game_id" ? h("a", { href: `#/dispute/${d.game_id}` }, `dispute ${d.game_id}`)
        : c === "job_id" ? h("a", { href: `#/job/${d.job_id}` }, `job ${d.job_id}`)
        : c === "to_move" || c === "winner" ? (d[c] ? addr(d[c], d) : "–")
        : c === "phase" ? statusTag(d.phase) : undefined,
    })),
  );
}

function renderJob(view, data) {
  const j = data.job;
  const ctx = { token: j.token };
  const deadlines = Object.entries(j).filter(([k]) => DEADLINE_KEY.test(k));
  fill(view, 
    h("h2", {}, `Job ${j.job_id} `, statusTag(j.status)),
    section("Deadlines", h("table", { class: "kv", id: "deadlines" }, deadlines.map(([k, v]) =>
      h("tr", { "data-key": k }, h("th", {}, k), h("td", {}, utc(v), " ", countdown(v)))))),
    section("Model (job bundle)", j.model ? kvTable(j.model, ctx) : h("p", { class: "muted" }, j.model_note || "unknown")),
    section("Terms on chain", kvTable(j.terms, ctx)),
    section("Job state", kvTable(j, ctx, ["terms", "slots", "disputes", "events", "model", "model_note", "token", "job_id",
      ...deadlines.map(([k]) => k), ...Object.keys(j.terms).filter((k) => String(j.terms[k]) === String(j[k]))])),
    section("Slots", grid(j.slots, ctx, {
      rowAttrs: (r) => ({ "data-slot": r.slot, "data-status": r.status }),
      cell: (c, r) => c === "status" ? statusTag(r.status) : undefined,
    })),
    section("Disputes", grid(j.disputes, ctx, {
      empty: "no dispute",
      cell: (c, d) => c === "game_id" ? h("a", { href: `#/dispute/${d.game_id}` }, `dispute ${d.game_id}`)
        : c === "phase" ? statusTag(d.phase) : undefined,
    })),
    section("Market events", grid(j.events.map((e) => ({ time: e.time, block: e.block, event: e.name, args: e.args })), ctx, {
      cell: (c, e) => c === "time" ? utc(e.time) : c === "args" ? kvInline(e.args, ctx) : undefined,
    })),
  );
}
function kvInline(obj, ctx) {
  return h("span", { class: "inline" }, Object.entries(obj).map(([k, v]) => h("span", { class: "pair" }, `${k}=`, value(k, v, ctx), " ")));
}

// One panel per level: each move that narrowed the level is a row; the bar spans [lo, hi] on the level's range.
function levelPanel(lv) {
  const W = 300, rowH = 16, top = 18, left = 4, right = 92;
  const ivs = lv.intervals;
  const last = ivs[ivs.length - 1];
  const panel = h("div", {
    class: `level level-${lv.state.replace(" ", "-")}`, "data-level": lv.level, "data-state": lv.state,
    "data-lo": last ? last.lo : null, "data-hi": last ? last.hi : null, "data-moves": ivs.length,
  });
  const head = last ? `[${last.lo}, ${last.hi}] of [0, ${last.total}]` : "not reached";
  panel.append(h("h4", {}, `L${lv.level} ${lv.name}`, h("span", { class: "lvstate" }, ` ${lv.state}`)),
    h("div", { class: "current" }, head));
  if (!ivs.length) return panel;
  const total = Math.max(1, Number(ivs[0].total));
  const svg = s("svg", { width: W, height: top + rowH * ivs.length + 4, class: "bars" });
  const span = W - left - right;
  svg.append(s("line", { x1: left, x2: left + span, y1: 10, y2: 10, class: "axis" }));
  svg.append(s("text", { x: left, y: 8, class: "tick" }, "0"));
  svg.append(s("text", { x: left + span, y: 8, class: "tick", "text-anchor": "end" }, String(total)));
  ivs.forEach((iv, i) => {
    const x0 = left + span * Number(iv.lo) / total;
    const w = Math.max(3, span * (Number(iv.hi) - Number(iv.lo)) / total);
    const y = top + i * rowH;
    const cls = i === ivs.length - 1 ? (lv.state === "active" ? "bar now" : "bar final") : "bar";
    const bar = s("rect", { x: x0, y, width: w, height: rowH - 4, class: cls });
    bar.append(s("title", {}, `[${iv.lo}, ${iv.hi}] by ${iv.by || "?"} (${iv.function || "?"}) at ${utc(iv.time)}, block ${iv.block}`));
    svg.append(bar);
    svg.append(s("text", { x: left + span + 6, y: y + rowH - 6, class: "lbl" },
      `[${iv.lo}, ${iv.hi}] ${iv.by ? iv.by[0].toUpperCase() : ""}`));
  });
  panel.append(svg);
  panel.append(h("ol", { class: "ivlist" }, ivs.map((iv) => h("li", {},
    `[${iv.lo}, ${iv.hi}] `, h("span", { class: "muted" }, `${iv.by || "?"} · ${iv.function || "?"} · ${hms(iv.time)} · block ${iv.block}`)))));
  return panel;
}

function clockBox(side, d) {
  const c = d.clocks;
  const left = Number(c[`${side}_left`]);
  const running = c.running === side;
  return h("div", { class: `clock${running ? " running" : ""}`, id: `clock-${side}`, "data-running": running ? "yes" : "no",
    "data-left": left, "data-turn-start": c.turn_started_at },
    h("div", { class: "who" }, side, " ", addr(d[side])),
    h("div", { class: "left" }, duration(left)),
    h("div", { class: "muted" }, running ? "running: its move" : c.running ? "stopped" : "game over"));
}

function f32cells(v) {
  return [h("td", { class: "float" }, v.float), h("td", {}, h("code", {}, v.bits)), h("td", {}, h("code", { class: "binary" }, v.binary))];
}

function endPanel(d) {
  const e = d.end;
  const winnerRole = e.winner_role;
  const out = h("section", { id: "end", "data-resolution": e.resolution, "data-winner": e.winner, "data-winner-role": winnerRole },
    h("h3", {}, "Resolution"),
    h("p", { class: "verdict" }, `Resolved by ${e.resolution}: the ${winnerRole} wins `, addr(e.winner),
      ` (the ${e.loser_role} loses${e.resolution === "TIMEOUT" ? `: its clock ran out in ${e.phase_before}` : ""}).`));
  const site = [];
  if (d.step) site.push(["training step", d.step]);
  if (d.node_label !== null || e.instruction) site.push(["graph node", `${d.node}${d.node_label ? ` (${d.node_label})` : ""}`]);
  if (d.element_value) site.push(["output element", d.element]);
  if (d.element_value) site.push(["defender's value there", `${d.element_value.float} (${d.element_value.bits})`]);
  if (site.length) out.append(h("table", { class: "kv", id: "site" }, site.map(([k, v]) => h("tr", {}, h("th", {}, k), h("td", { "data-key": k }, String(v))))));
  const ins = e.instruction;
  if (ins) {
    const rows = ins.operands.map((o) => h("tr", {}, h("th", {}, `${o.operand} = r${o.register}`), ...f32cells(o)));
    if (ins.memory) {
      const m = ins.memory;
      rows.push(h("tr", {}, h("th", {}, m.address === null ? `input ${m.input}: no read` : `in${m.input}[${m.address}]`),
        ...(m.bits ? f32cells(m) : [h("td", { colspan: 3 }, "index out of range: result is NaN")])));
    }
    if (ins.immediate && ins.immediate.bits) rows.push(h("tr", {}, h("th", {}, "immediate"), ...f32cells(ins.immediate)));
    if (ins.immediate && ins.immediate.axis !== undefined) {
      rows.push(h("tr", {}, h("th", {}, `coord axis ${ins.immediate.axis}`), h("td", { colspan: 3 }, String(ins.immediate.coordinate))));
    }
    rows.push(h("tr", { class: "result" }, h("th", {}, `result r${ins.result.register}`), ...f32cells(ins.result)));
    out.append(h("div", { id: "instruction", "data-op": ins.op, "data-micro-step": ins.micro_step },
      h("h4", {}, `The one instruction: micro-step ${ins.micro_step} of ${ins.micro_steps} (loop index k = ${ins.k}), element ${ins.element} at (${ins.coords.join(", ")})`),
      h("pre", { class: "asm" }, `${ins.assembly}      ; ${ins.op}, word ${ins.word}`),
      h("table", { class: "grid operands" }, h("thead", {}, h("tr", {}, ["", "binary32", "bits", "sign exponent mantissa"].map((c) => h("th", {}, c)))),
        h("tbody", {}, rows)),
      h("table", { class: "kv" },
        h("tr", {}, h("th", {}, "agreed pre-state s_j"), h("td", {}, h("code", {}, ins.agreed_pre))),
        h("tr", {}, h("th", {}, "post-state computed on chain"), h("td", {}, h("code", {}, ins.post_state))),
        h("tr", {}, h("th", {}, "defender's claimed post-state"), h("td", {}, h("code", {}, ins.claimed_post))),
        h("tr", {}, h("th", {}, "verdict"), h("td", { id: "claim-verdict" },
          ins.defender_claim_holds ? "equal: the defender's claim holds" : "different: the defender's claim is false")))));
  }
  return out;
}

function renderDispute(view, data) {
  const d = data.dispute;
  const ctx = { token: d.token, parties: d };
  const parties = ["defender", "challenger", "other"].map((r) => ({ party: r, ...d.parties[r] }))
    .filter((p) => p.party !== "other" || p.moves > 0);
  fill(view, 
    h("h2", {}, `Dispute ${d.game_id} `, statusTag(d.phase), " ",
      h("span", { class: "muted" }, "on "), h("a", { href: `#/job/${d.job_id}` }, `job ${d.job_id}`),
      h("span", { class: "muted" }, ` · ${d.kind} · bond ${amount(d.bond_posted, d.token)}`)),
    h("div", { class: "clocks" }, clockBox("defender", d), clockBox("challenger", d)),
    section("Levels", h("p", { class: "muted" }, d.node_label ? `node ${d.node}: ${d.node_label}` : d.model_note || ""),
      h("div", { class: "levels" }, d.levels.map(levelPanel))),
    d.end ? endPanel(d) : null,
    section("Moves and gas by party", grid(parties, ctx, {
      cols: ["party", "address", "moves", "gas", "moves_by_level"],
      cell: (c, p) => c === "address" ? (p.address ? addr(p.address) : "anyone else") : c === "gas" ? Number(p.gas).toLocaleString("en-US")
        : c === "moves_by_level" ? Object.entries(p.moves_by_level).map(([l, n]) => `L${l}: ${n}`).join("  ") : undefined,
    })),
    section("Moves", grid(d.moves.map((m, i) => ({ "#": i + 1, ...m })), ctx, {
      cols: ["#", "time", "block", "role", "function", "level", "gas", "phase", "interval"],
      rowAttrs: (m) => ({ "data-function": m.function, "data-role": m.role }),
      cell: (c, m) => c === "time" ? utc(m.time) : c === "gas" ? Number(m.gas).toLocaleString("en-US")
        : c === "interval" ? (m.interval ? `L${m.interval.level} [${m.interval.lo}, ${m.interval.hi}] of [0, ${m.interval.total}]` : "–")
        : c === "level" ? (m.level ? `L${m.level}` : "open") : undefined,
    })),
  );
}

// -- data flow ---------------------------------------------------------------------------------------

async function render() {
  renderBanner();
  const view = document.getElementById("view");
  const r = route();
  if (r.view === "home") { S.detailKey = null; renderHome(view); tick(); return; }
  const key = `${r.view}/${r.id}`;
  const version = S.summary ? S.summary.version : 0;
  if (S.detailKey !== key || S.detailVersion !== version) {
    const res = await fetch(`/api/${r.view === "job" ? "jobs" : "disputes"}/${r.id}`).catch(() => null);
    if (!res) return;
    const body = await res.json();
    if (route().view !== r.view) return; // navigated away meanwhile
    S.detail = res.ok ? body : { error: body.error };
    S.detailKey = key; S.detailVersion = version;
  }
  if (S.detail.error) fill(view, h("p", { class: "error", id: "not-found" }, S.detail.error));
  else if (r.view === "job") renderJob(view, S.detail);
  else renderDispute(view, S.detail);
  tick();
}

// Countdowns and the running chess clock, between server updates.
function tick() {
  const now = chainNow();
  if (now === null) return;
  for (const el of document.querySelectorAll("[data-deadline]")) {
    const left = Number(el.dataset.deadline) - now;
    el.textContent = left >= 0 ? `(in ${duration(left)})` : `(passed ${duration(-left)} ago)`;
    el.classList.toggle("passed", left < 0);
  }
  for (const el of document.querySelectorAll(".clock[data-running=yes]")) {
    const left = Number(el.dataset.left) - Math.max(0, now - Number(el.dataset.turnStart));
    el.querySelector(".left").textContent = left >= 0 ? duration(left) : `out of time (${duration(-left)} over)`;
    el.classList.toggle("expired", left < 0);
  }
}

function connect() {
  const es = new EventSource("/api/stream");
  es.addEventListener("state", (ev) => {
    S.summary = JSON.parse(ev.data);
    S.received = Date.now();
    S.stream = "up";
    render();
  });
  es.onerror = () => { S.stream = "down"; renderBanner(); }; // EventSource reconnects by itself
}

window.addEventListener("hashchange", render);
setInterval(tick, 250);
connect();
