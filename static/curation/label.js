// The labelling form: a key shown beside an option picks it (a choice or rating: that one; a
// multi-choice: toggles it), Enter submits, and "Mark selection" turns the text selected in the
// item into a span of that label. Keys do nothing while a text box has the focus.
(function () {
  "use strict";
  function ready(fn) {
    if (document.readyState !== "loading") fn();
    else document.addEventListener("DOMContentLoaded", fn);
  }
  ready(function () {
    var form = document.querySelector("form[data-label-form]");
    if (!form) return;
    var byKey = {};
    form.querySelectorAll("input[data-key]").forEach(function (input) {
      byKey[input.dataset.key] = input;
    });
    document.addEventListener("keydown", function (event) {
      var target = event.target;
      var typing = target && (target.tagName === "TEXTAREA" ||
        (target.tagName === "INPUT" && (target.type === "text" || target.type === "search")));
      if (event.key === "Enter" && (!typing || event.ctrlKey || event.metaKey)) {
        if (target && target.tagName === "BUTTON") return;
        event.preventDefault();
        form.requestSubmit();
        return;
      }
      if (typing || event.ctrlKey || event.metaKey || event.altKey) return;
      var input = byKey[event.key.toLowerCase()];
      if (!input) return;
      event.preventDefault();
      input.checked = input.type === "checkbox" ? !input.checked : true;
      input.dispatchEvent(new Event("change", {bubbles: true}));
    });

    var text = document.querySelector("[data-item-text]");
    form.querySelectorAll("[data-spans]").forEach(function (box) {
      var hidden = box.querySelector("input[type=hidden]");
      var list = box.querySelector("[data-span-list]");
      var spans = JSON.parse(hidden.value || "[]");
      function render() {
        hidden.value = JSON.stringify(spans);
        list.textContent = "";
        spans.forEach(function (span, index) {
          var item = document.createElement("li");
          item.textContent = span.label + ": \u201c" + text.textContent.slice(span.start, span.end) + "\u201d ";
          var remove = document.createElement("button");
          remove.type = "button";
          remove.textContent = "remove";
          remove.addEventListener("click", function () { spans.splice(index, 1); render(); });
          item.appendChild(remove);
          list.appendChild(item);
        });
      }
      box.querySelectorAll("button[data-span-label]").forEach(function (button) {
        button.addEventListener("click", function () {
          var selection = window.getSelection();
          if (!selection.rangeCount || selection.isCollapsed) return;
          var range = selection.getRangeAt(0);
          if (!text.contains(range.startContainer) || !text.contains(range.endContainer)) return;
          var before = document.createRange();
          before.setStart(text, 0);
          before.setEnd(range.startContainer, range.startOffset);
          var start = before.toString().length;
          var end = start + range.toString().length;
          if (end > start) spans.push({start: start, end: end, label: button.dataset.spanLabel});
          selection.removeAllRanges();
          render();
        });
      });
      render();
    });
    form.dataset.ready = "true"; // the keys are bound
  });
})();
