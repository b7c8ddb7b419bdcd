// The ids that end generation: tokenizer_config.json's eos_token plus config.json's eos ids.
#include "text/stop_tokens.h"

#include <algorithm>

#include "core/error.h"

namespace lily {

std::vector<uint32_t> stop_token_ids(const Tokenizer& tokenizer, const Json& tokenizer_config,
                                     const std::vector<uint32_t>& config_eos_ids,
                                     std::string_view where) {
  std::vector<uint32_t> ids;
  auto add = [&](uint32_t id) {
    if (std::find(ids.begin(), ids.end(), id) == ids.end()) ids.push_back(id);
  };
  if (!tokenizer_config.is_object()) {
    throw InputError(std::string(where) + " is " + describe_json(tokenizer_config) +
                     ", expected an object");
  }
  if (auto it = tokenizer_config.find("eos_token"); it != tokenizer_config.end() && !it->is_null()) {
    const Json* text = &*it;
    if (it->is_object()) {
      auto content = it->find("content");
      if (content == it->end()) {
        throw InputError(std::string(where) + ": eos_token.content is missing");
      }
      text = &*content;
    }
    if (!text->is_string()) {
      throw InputError(std::string(where) + ": eos_token is " + describe_json(*it) +
                       ", expected a string or an object with a string \"content\"");
    }
    if (auto id = tokenizer.token_to_id(text->get_ref<const std::string&>())) add(*id);
  }
  for (uint32_t id : config_eos_ids) add(id);
  return ids;
}

}  // namespace lily
