// The lily subcommands, each taking its arguments after the subcommand name.
#pragma once

#include <string>
#include <vector>

namespace lily {

int cmd_inspect(const std::vector<std::string>& args);
int cmd_make_checkpoint(const std::vector<std::string>& args);
int cmd_tokenize(const std::vector<std::string>& args);
int cmd_run(const std::vector<std::string>& args);
int cmd_render_chat(const std::vector<std::string>& args);
int cmd_parse_output(const std::vector<std::string>& args);
int cmd_serve(const std::vector<std::string>& args);
int cmd_bench(const std::vector<std::string>& args);

}  // namespace lily
