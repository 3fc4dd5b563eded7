// The calling thread's tag: later reserves and creates of this thread (through compute_client,
// the C interface and the PyTorch and CuPy glue) carry it, unless they name a tag themselves. See
// devrt/memory/tag.hpp for what a tag does.
//
//     {
//       devrt::runtime::tag_scope weights("weights");
//       auto w = client.reserve(bytes).get();   // tagged "weights"
//     }                                          // the previous tag again
#pragma once

#include <string_view>

#include "devrt/memory/tag.hpp"

namespace devrt::runtime {

/// The calling thread's tag (empty: none).
[[nodiscard]] const memory::tag_name& current_tag() noexcept;
/// Its number (memory::intern_tag; 0: none): what reserves carry.
[[nodiscard]] memory::tag_id current_tag_id() noexcept;
/// Sets the calling thread's tag (empty: none). Error invalid_argument when the process has
/// `memory::max_tags` tags already; the tag is then unchanged.
result<void> set_current_tag(const memory::tag_name& tag);

/// Sets the calling thread's tag while it lives, and puts the previous one back when it ends.
/// Scopes nest; each one belongs to the thread that made it. Throws devrt::exception
/// (invalid_argument) for a malformed tag (memory::tag_name::make).
class tag_scope {
 public:
  explicit tag_scope(std::string_view tag);
  explicit tag_scope(const memory::tag_name& tag);
  tag_scope(const tag_scope&) = delete;
  tag_scope& operator=(const tag_scope&) = delete;
  ~tag_scope();

 private:
  memory::tag_id previous_ = 0;
};

}  // namespace devrt::runtime
