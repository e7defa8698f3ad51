/* Feature registry forms: the schema editor's add/remove row buttons, and the upload form, which
   posts with XMLHttpRequest so that a large file shows its upload progress. No build step. */
(function () {
  "use strict";

  function setUpSchemaEditor(editor) {
    var rows = editor.querySelector("[data-schema-rows]");
    var template = editor.querySelector("#schema-row-template");
    var added = 0;
    editor.querySelector("[data-add-row]").addEventListener("click", function () {
      added += 1;
      var row = template.content.firstElementChild.cloneNode(true);
      row.querySelectorAll("[id]").forEach(function (el) { el.id = el.id.replace("new", "added-" + added); });
      row.querySelectorAll("label[for]").forEach(function (el) { el.htmlFor = el.htmlFor.replace("new", "added-" + added); });
      rows.appendChild(row);
      row.querySelector("input").focus();
    });
    rows.addEventListener("click", function (event) {
      var button = event.target.closest("[data-remove-row]");
      if (button && rows.children.length > 1) button.closest("tr").remove();
    });
  }

  function setUpUpload(form) {
    var target = form.parentElement.querySelector("[data-upload-target]");
    var progress = form.querySelector("[data-upload-progress]");
    var bar = progress.querySelector("progress");
    var percent = progress.querySelector("[data-upload-percent]");
    form.addEventListener("submit", function (event) {
      event.preventDefault();
      var file = form.querySelector("input[type=file]").files[0];
      var limit = parseInt(form.dataset.maxBytes, 10);
      if (file && limit && file.size > limit) {
        target.innerHTML = "";
        var tooBig = document.createElement("p");
        tooBig.className = "error";
        tooBig.setAttribute("data-testid", "upload-refused");
        tooBig.textContent = "Refused: " + file.name + " is " + file.size + " bytes, over the " +
          limit + "-byte limit of this page; push it through the batches API instead.";
        target.appendChild(tooBig);
        return;
      }
      var xhr = new XMLHttpRequest();
      var button = form.querySelector("button[type=submit]");
      xhr.open("POST", form.action);
      xhr.setRequestHeader("X-Requested-With", "XMLHttpRequest");
      xhr.upload.addEventListener("progress", function (e) {
        if (!e.lengthComputable) return;
        var share = Math.round((100 * e.loaded) / e.total);
        bar.value = share;
        percent.textContent = share === 100 ? "100% sent, storing…" : share + "%";
      });
      xhr.addEventListener("load", function () {
        button.disabled = false;
        progress.hidden = true;
        var type = xhr.getResponseHeader("Content-Type") || "";
        if (type.indexOf("text/html") === 0) {
          target.innerHTML = xhr.responseText;
        } else {
          var detail = "the server answered " + xhr.status;
          try { detail = JSON.parse(xhr.responseText).detail || detail; } catch (e) { /* not JSON */ }
          target.innerHTML = "";
          var p = document.createElement("p");
          p.className = "error";
          p.setAttribute("data-testid", "upload-refused");
          p.textContent = "Refused: " + detail;
          target.appendChild(p);
        }
      });
      xhr.addEventListener("error", function () {
        button.disabled = false;
        progress.hidden = true;
        target.innerHTML = '<p class="error" data-testid="upload-refused">The upload failed: the connection was lost.</p>';
      });
      button.disabled = true;
      bar.value = 0;
      percent.textContent = "0%";
      progress.hidden = false;
      target.innerHTML = "";
      xhr.send(new FormData(form));
    });
  }

  function setUpFeaturePicker(search) {
    var choices = document.querySelectorAll("[data-feature-choices] label[data-ref]");
    search.addEventListener("input", function () {
      var needle = search.value.trim().toLowerCase();
      choices.forEach(function (label) {
        var input = label.querySelector("input");
        label.hidden = needle !== "" && !input.checked && label.dataset.ref.indexOf(needle) === -1;
      });
    });
  }

  function setUpBusyNote(form) {
    form.addEventListener("submit", function () {
      var note = form.querySelector("[data-busy]");
      note.textContent = form.dataset.busyText;
      note.hidden = false;
    });
  }

  // htmx does not swap a 4xx answer; a swap target marked data-swap-errors shows its 400 body
  // (the fields at fault) like a success, e.g. the dataset form's Preview. htmx fires the event on
  // the target.
  document.addEventListener("htmx:beforeSwap", function (event) {
    var target = event.target;
    if (event.detail.xhr.status === 400 && target.closest && target.closest("[data-swap-errors]")) {
      event.detail.shouldSwap = true;
      event.detail.isError = false;
    }
  });

  document.addEventListener("DOMContentLoaded", function () {
    document.querySelectorAll("[data-feature-search]").forEach(setUpFeaturePicker);
    document.querySelectorAll("form[data-busy-text]").forEach(setUpBusyNote);
    document.querySelectorAll("[data-testid=schema-editor]").forEach(setUpSchemaEditor);
    document.querySelectorAll("[data-upload-form]").forEach(setUpUpload);
  });
})();
