// tokenizer.json variants for the oracle (--set variants): edits of the tiny synthetic file that lily accepts or refuses.
//
// ACCEPTED: {name, edit(json), changesIds?}. Each must load in lily and HF and give the
// same ids and text in both; unless changesIds, HF's results must also equal the
// original's (the edit cannot matter).
// REFUSED: {name, edit(json), field, kind, addSpecialTokens?}. lily must refuse each with
// a message naming `field`. kind "hf-refuses": HF refuses the file too; "changes": HF
// reads it and gives other ids or text than for the original on some string (encoding
// with add_special_tokens when addSpecialTokens); "policy": refused on principle, HF may
// give the original's results.
'use strict';

const preByteLevel = (j) => j.pre_tokenizer.pretokenizers[1];
const split = (j) => j.pre_tokenizer.pretokenizers[0];
const allTrue = { type: 'ByteLevel', add_prefix_space: true, trim_offsets: true, use_regex: true };
const MODEL_OPTIONS = ['dropout', 'unk_token', 'continuing_subword_prefix', 'end_of_word_suffix', 'fuse_unk',
  'byte_fallback', 'ignore_merges'];

// Vocab tokens BPE does not reach from their bytes (the tiny vocab lacks them), given ids
// N, N+1, ...; the added tokens move up behind them.
function addUnreachableTokens(j) {
  const extra = ['\u0120inference', '\u0120server', '\u0120the', 'Hello', '\u0120tokenizer', '\u0120checkpoint'];
  let n = Object.keys(j.model.vocab).length;
  let added = 0;
  for (const token of extra) {
    if (token in j.model.vocab) continue;
    j.model.vocab[token] = n++;
    ++added;
  }
  for (const t of j.added_tokens) t.id += added;
}

const ACCEPTED = [
  { name: 'decoder ByteLevel flags all true', edit: (j) => { j.decoder = { ...allTrue }; } },
  { name: 'decoder without use_regex', edit: (j) => { delete j.decoder.use_regex; } },
  { name: 'decoder Sequence of one ByteLevel', edit: (j) => { j.decoder = { type: 'Sequence', decoders: [j.decoder] }; } },
  { name: 'post_processor ByteLevel flags all true', edit: (j) => { j.post_processor = { ...allTrue }; } },
  { name: 'post_processor without use_regex', edit: (j) => { delete j.post_processor.use_regex; } },
  { name: 'post_processor null', edit: (j) => { j.post_processor = null; } },
  { name: 'post_processor absent', edit: (j) => { delete j.post_processor; } },
  {
    name: 'post_processor Sequence of ByteLevels',
    edit: (j) => { j.post_processor = { type: 'Sequence', processors: [j.post_processor, { ...allTrue }] }; },
  },
  { name: 'post_processor empty Sequence', edit: (j) => { j.post_processor = { type: 'Sequence', processors: [] }; } },
  { name: 'pre-tokenizer ByteLevel trim_offsets true', edit: (j) => { preByteLevel(j).trim_offsets = true; } },
  // Isolated keeps matches and the text between them alike, so inverting the pattern's
  // matches changes no piece.
  { name: 'split invert true', edit: (j) => { split(j).invert = true; } },
  {
    // What transformers' Qwen2 converter writes: ByteLevel() and ByteLevel(trim_offsets=False).
    name: 'transformers Qwen2 converter defaults',
    edit: (j) => {
      preByteLevel(j).trim_offsets = true;
      j.decoder = { ...allTrue };
      j.post_processor = { type: 'ByteLevel', add_prefix_space: true, trim_offsets: false, use_regex: true };
    },
  },
  { name: 'normalizer Sequence of one NFC', edit: (j) => { j.normalizer = { type: 'Sequence', normalizers: [j.normalizer] }; } },
  { name: 'version absent', edit: (j) => { delete j.version; } },
  { name: 'truncation and padding absent', edit: (j) => { delete j.truncation; delete j.padding; } },
  { name: 'model without type', edit: (j) => { delete j.model.type; } },
  { name: 'model.dropout 0', edit: (j) => { j.model.dropout = 0; } },
  { name: 'model.unk_token not in the vocab', edit: (j) => { j.model.unk_token = '<unk>'; } },
  { name: 'model.unk_token in the vocab with fuse_unk', edit: (j) => { j.model.unk_token = '!'; j.model.fuse_unk = true; } },
  { name: 'model.byte_fallback true', edit: (j) => { j.model.byte_fallback = true; } },
  {
    // The tiny vocab holds tokens its merges do not reach from their bytes (a random split
    // tree builds each pseudo-word), so ignore_merges changes ids: lily must follow.
    name: 'model.ignore_merges true',
    changesIds: true,
    edit: (j) => { j.model.ignore_merges = true; },
  },
  { name: 'model options null', edit: (j) => { for (const k of MODEL_OPTIONS) j.model[k] = null; } },
  { name: 'model options absent', edit: (j) => { for (const k of MODEL_OPTIONS) delete j.model[k]; } },
  {
    name: 'model.ignore_merges true with unreachable vocab tokens',
    changesIds: true,
    edit: (j) => { addUnreachableTokens(j); j.model.ignore_merges = true; },
  },
  {
    // The same vocab without ignore_merges: BPE never emits the new tokens.
    name: 'unreachable vocab tokens without ignore_merges',
    changesIds: true,
    edit: (j) => { addUnreachableTokens(j); },
  },
];

const REFUSED = [
  { name: 'decoder ByteLevel without flags', kind: 'hf-refuses', field: 'decoder.add_prefix_space', edit: (j) => { j.decoder = { type: 'ByteLevel' }; } },
  { name: 'decoder without trim_offsets', kind: 'hf-refuses', field: 'decoder.trim_offsets', edit: (j) => { delete j.decoder.trim_offsets; } },
  { name: 'decoder use_regex not boolean', kind: 'hf-refuses', field: 'decoder.use_regex', edit: (j) => { j.decoder.use_regex = 'yes'; } },
  { name: 'decoder null', kind: 'changes', field: 'decoder', edit: (j) => { j.decoder = null; } },
  { name: 'decoder absent', kind: 'changes', field: 'decoder', edit: (j) => { delete j.decoder; } },
  { name: 'decoder Sequence of two ByteLevels', kind: 'changes', field: 'decoder.decoders', edit: (j) => { j.decoder = { type: 'Sequence', decoders: [j.decoder, j.decoder] }; } },
  { name: 'post_processor without add_prefix_space', kind: 'hf-refuses', field: 'post_processor.add_prefix_space', edit: (j) => { delete j.post_processor.add_prefix_space; } },
  {
    name: 'post_processor TemplateProcessing',
    kind: 'changes',
    addSpecialTokens: true,
    field: 'post_processor.type',
    edit: (j) => {
      const eos = j.added_tokens.find((t) => t.content === '<|endoftext|>');
      j.post_processor = {
        type: 'TemplateProcessing',
        single: [{ Sequence: { id: 'A', type_id: 0 } }, { SpecialToken: { id: '<|endoftext|>', type_id: 0 } }],
        pair: [{ Sequence: { id: 'A', type_id: 0 } }, { Sequence: { id: 'B', type_id: 1 } }],
        special_tokens: { '<|endoftext|>': { id: '<|endoftext|>', ids: [eos.id], tokens: ['<|endoftext|>'] } },
      };
    },
  },
  { name: 'pre-tokenizer ByteLevel add_prefix_space true', kind: 'changes', field: 'pretokenizers[1].add_prefix_space', edit: (j) => { preByteLevel(j).add_prefix_space = true; } },
  { name: 'pre-tokenizer ByteLevel without add_prefix_space', kind: 'hf-refuses', field: 'pretokenizers[1].add_prefix_space', edit: (j) => { delete preByteLevel(j).add_prefix_space; } },
  { name: 'pre-tokenizer ByteLevel use_regex true', kind: 'changes', field: 'pretokenizers[1].use_regex', edit: (j) => { preByteLevel(j).use_regex = true; } },
  { name: 'pre-tokenizer ByteLevel without use_regex', kind: 'changes', field: 'pretokenizers[1].use_regex', edit: (j) => { delete preByteLevel(j).use_regex; } },
  { name: 'pre-tokenizer ByteLevel without trim_offsets', kind: 'hf-refuses', field: 'pretokenizers[1].trim_offsets', edit: (j) => { delete preByteLevel(j).trim_offsets; } },
  { name: 'split behavior Removed', kind: 'changes', field: 'pretokenizers[0].behavior', edit: (j) => { split(j).behavior = 'Removed'; } },
  { name: 'split without invert', kind: 'hf-refuses', field: 'pretokenizers[0].invert', edit: (j) => { delete split(j).invert; } },
  { name: 'split without behavior', kind: 'hf-refuses', field: 'pretokenizers[0].behavior', edit: (j) => { delete split(j).behavior; } },
  { name: 'normalizer null', kind: 'changes', field: 'normalizer', edit: (j) => { j.normalizer = null; } },
  { name: 'normalizer NFKC', kind: 'changes', field: 'normalizer.type', edit: (j) => { j.normalizer = { type: 'NFKC' }; } },
  { name: 'version 2.0', kind: 'hf-refuses', field: 'version', edit: (j) => { j.version = '2.0'; } },
  { name: 'truncation max_length 5', kind: 'changes', field: 'truncation', edit: (j) => { j.truncation = { direction: 'Right', max_length: 5, strategy: 'LongestFirst', stride: 0 }; } },
  {
    name: 'padding BatchLongest',
    kind: 'changes',
    field: 'padding',
    edit: (j) => { j.padding = { strategy: 'BatchLongest', direction: 'Right', pad_to_multiple_of: null, pad_id: 0, pad_type_id: 0, pad_token: '!' }; },
  },
  { name: 'unknown top-level field', kind: 'hf-refuses', field: 'extra is an unknown field', edit: (j) => { j.extra = null; } },
  { name: 'model.dropout 0.5', kind: 'changes', field: 'model.dropout', edit: (j) => { j.model.dropout = 0.5; } },
  { name: 'model.dropout 2', kind: 'hf-refuses', field: 'model.dropout', edit: (j) => { j.model.dropout = 2; } },
  { name: 'model.unk_token not a string', kind: 'hf-refuses', field: 'model.unk_token', edit: (j) => { j.model.unk_token = 5; } },
  { name: 'model.end_of_word_suffix', kind: 'changes', field: 'model.end_of_word_suffix', edit: (j) => { j.model.end_of_word_suffix = '</w>'; } },
  { name: 'model unknown field', kind: 'policy', field: 'model.cache_capacity is an unknown field', edit: (j) => { j.model.cache_capacity = 5; } },
  { name: 'added token normalized true', kind: 'changes', field: 'added_tokens[25].normalized', edit: (j) => { j.added_tokens[25].normalized = true; } },
  { name: 'added token lstrip true', kind: 'changes', field: 'added_tokens[2].lstrip', edit: (j) => { j.added_tokens[2].lstrip = true; } },
  { name: 'added token rstrip true', kind: 'changes', field: 'added_tokens[2].rstrip', edit: (j) => { j.added_tokens[2].rstrip = true; } },
  { name: 'added token single_word true', kind: 'changes', field: 'added_tokens[25].single_word', edit: (j) => { j.added_tokens[25].single_word = true; } },
  { name: 'added token without special', kind: 'hf-refuses', field: 'added_tokens[0].special', edit: (j) => { delete j.added_tokens[0].special; } },
  { name: 'added token without lstrip', kind: 'hf-refuses', field: 'added_tokens[0].lstrip', edit: (j) => { delete j.added_tokens[0].lstrip; } },
  { name: 'added token unknown field', kind: 'policy', field: 'added_tokens[0].weight is an unknown field', edit: (j) => { j.added_tokens[0].weight = 1; } },
  { name: 'added token with another id', kind: 'policy', field: 'added_tokens[0].id', edit: (j) => { j.added_tokens[0].id = 99999; } },
];

module.exports = { ACCEPTED, REFUSED };
